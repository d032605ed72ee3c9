"""Writes two translation units per public header, compiled by the build (tests/headers):

  alone_<name>.cpp     #include "grouplin/<name>.hpp" and nothing else: the header stands alone
  example_<name>.cpp   the header's usage example (the first block of "//   " lines in its opening
                       comment) as the body of a function, with only that header and the C++
                       standard library included: the example compiles as written

usage: make_header_tests.py OUT_DIR HEADER...
"""
import os
import sys

STD = ["<cstddef>", "<cstdint>", "<iostream>", "<memory>", "<string>", "<vector>"]


def example_lines(path):
    """The first run of '//   ' lines (and bare '//' lines inside it) before '#pragma once'."""
    lines, started = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#pragma once"):
                break
            if line.startswith("//   "):
                started = True
                lines.append(line[5:])
            elif started and line == "//":
                lines.append("")
            elif started:
                break
    while lines and not lines[-1]:
        lines.pop()
    return lines


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    out_dir, headers = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    for header in headers:
        name = os.path.splitext(os.path.basename(header))[0]
        include = '#include "grouplin/%s.hpp"\n' % name
        write_if_changed(os.path.join(out_dir, "alone_%s.cpp" % name), include)
        body = example_lines(header)
        if not body:
            sys.exit("%s: no usage example (a block of '//   ' lines) in its opening comment" % header)
        text = include + "".join("#include %s\n" % s for s in STD)
        text += "\nnamespace example_%s {\n[[maybe_unused]] void run() {\n" % name
        text += "".join(("  " + l if l else "") + "\n" for l in body)
        text += "}\n}  // namespace example_%s\n" % name
        write_if_changed(os.path.join(out_dir, "example_%s.cpp" % name), text)


if __name__ == "__main__":
    main()
