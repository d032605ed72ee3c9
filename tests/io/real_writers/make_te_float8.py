"""Writes te<VERSION>_float8.pt: TransformerEngine's Float8Tensor as each release pickled it,
made by that release's own code.

TransformerEngine cannot be built here (its CUDA extension), so for each release this script
takes from TE's git history (`git show TAG:...`) what decides the bytes of a pickled
Float8Tensor, and runs it in stand-in modules of the same import paths:

- the C++ `enum class DType` of transformer_engine.h and the pybind11 `enum_<DType>` statement
  of TE's bindings (pybind.cpp, later pybind_helper.h, with the __reduce__ TE 2.16 added),
  compiled into a tiny extension module `transformer_engine_extensions` (TE <= 1.7) or
  `transformer_engine_torch`, so that the enum pickles as pybind11 makes it;
- the IntEnum `DType` of transformer_engine/pytorch/constants.py (TE >= 2.17);
- Float8Tensor's `__reduce_ex__` and `_make_in_reduce_ex`, and the module-level
  `_make_float8_tensor_in_reduce_ex` (TE >= 2.16), from float8_tensor.py, in a class of the
  module TE defines it in;

then torch.save (PyTorch 2.15 of scripts/peer-env.sh) pickles a small state dict: two experts of
FP8 codes (expert e's byte k is (k + 128 e) % 256, in the dtype TE's code for float8 e4m3 names
at that release) with their scale_inv (0.5, 0.25), beside a BF16 tensor. Nothing of it is
written by hand. tests/io/real_writers_test.cpp reads the committed files.

    PY=$(bash scripts/peer-env.sh | tail -1)
    $PY tests/io/real_writers/make_te_float8.py TE_GIT_DIR [TAG ...]

TE_GIT_DIR is a clone of https://github.com/NVIDIA/TransformerEngine (a bare one will do).
"""
import __future__
import ast
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from stub_modules import module  # noqa: E402
# One release of each form (docs/pt-format.md has the table): 1.2-1.7, 1.8-1.10, 1.11-1.13,
# 2.0-2.3 and 2.4-2.13 (the legacy route; 2.14 and 2.15 pickle CPU tensors dequantized, as plain
# tensors, and GPU ones as 2.13), 2.16, 2.17-2.18.
TAGS = ["v1.2", "v1.8", "v1.11", "v2.0", "v2.4", "v2.13", "v2.16", "v2.17", "v2.18"]


def git_show(repo, tag, path):
    r = subprocess.run(["git", "--git-dir", repo, "show", f"{tag}:{path}"], capture_output=True,
                       text=True)
    return r.stdout if r.returncode == 0 else None


def source_of(repo, tag, *paths):
    for p in paths:
        text = git_show(repo, tag, p)
        if text is not None:
            return p, text
    raise SystemExit(f"{tag}: none of {paths}")


def statement_from(text, start_pattern):
    """The C++ statement that starts at `start_pattern`, up to its `;` (macro line ends removed)."""
    m = re.search(start_pattern, text)
    if not m:
        return None
    depth, end = 0, m.start()
    while True:  # the first `;` outside brackets (a lambda's body has its own)
        c = text[end]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == ";" and depth == 0:
            break
        end += 1
    return re.sub(r"\\\n", "\n", text[m.start():end + 1])


def build_enum_module(repo, tag, name, workdir):
    """TE's DType enum of `tag` compiled with pybind11 (PyTorch's copy) as module `name`."""
    _, header = source_of(repo, tag,
                          "transformer_engine/common/include/transformer_engine/transformer_engine.h")
    enum = statement_from(header, r"enum class DType\s*\{")
    binding = None
    for p in ["transformer_engine/common/util/pybind_helper.h",
              "transformer_engine/pytorch/csrc/extensions/pybind.cpp"]:
        text = git_show(repo, tag, p)
        if text:
            binding = statement_from(text, r"(py|pybind11)::enum_<transformer_engine::DType>")
            if binding:
                break
    if binding is None:
        raise SystemExit(f"{tag}: no pybind11 enum_<DType> found")
    cpp = os.path.join(workdir, f"{name}.cpp")
    with open(cpp, "w") as f:
        f.write("#include <pybind11/pybind11.h>\nnamespace py = pybind11;\n"
                f"namespace transformer_engine {{\n{enum}\n}}\n"
                f"PYBIND11_MODULE({name}, m) {{\n{binding}\n}}\n")
    import torch.utils.cpp_extension as ext
    out = os.path.join(workdir, name + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-std=c++17",
                    "-I" + sysconfig.get_paths()["include"],
                    *["-I" + p for p in ext.include_paths()], cpp, "-o", out], check=True)
    sys.path.insert(0, workdir)
    return __import__(name)


def definitions(text, names, inside=None):
    """Source of the top-level definitions `names` of a Python file (of class `inside`'s body)."""
    tree = ast.parse(text)
    body = tree.body
    if inside:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == inside).body
    lines = text.splitlines()
    out = {}
    for node in body:
        if getattr(node, "name", None) in names:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            out[node.name] = textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))
    return out


def run(source, namespace):
    flags = __future__.annotations.compiler_flag  # as in TE's files: annotations never evaluated
    exec(compile(source, "<TransformerEngine>", "exec", flags=flags, dont_inherit=True), namespace)


def stand_in(repo, tag, path, source, class_name, module_function):
    """TE's tensor class `class_name` of `tag` as a stand-in in the module it is defined in
    (`path`, text `source`), with that release's `__reduce_ex__` and `_make_in_reduce_ex`, and
    its module-level reconstructor `module_function` where the release has one; TE's DType enum
    compiled from the release. Returns the class and the release's float8 e4m3 member."""
    import torch
    work = tempfile.mkdtemp(prefix="te-stub-")
    _, constants = source_of(repo, tag, "transformer_engine/pytorch/constants.py")
    ext_name = ("transformer_engine_extensions" if "transformer_engine_extensions" in constants
                else "transformer_engine_torch")
    tex = build_enum_module(repo, tag, ext_name, work)
    fp8_dtype = tex.DType.kFloat8E4M3
    mod = module(path[:-3].replace("/", "."))
    namespace = {"torch": torch, "tex": tex, "TE_DType": tex.DType, "__name__": mod.__name__}
    if "class DType(enum.IntEnum)" in constants:  # TE >= 2.17: the Python enum
        consts = module("transformer_engine.pytorch.constants")
        ns = {"enum": __import__("enum"), "tex": tex, "torch": torch,
              "__name__": consts.__name__}
        run(definitions(constants, {"DType"})["DType"], ns)
        consts.DType = ns["DType"]
        namespace["DType"] = ns["DType"]
        fp8_dtype = ns["DType"].kFloat8E4M3
    cls = type(class_name, (), {"__module__": mod.__name__})
    setattr(mod, class_name, cls)
    namespace[class_name] = cls
    top = definitions(source, {module_function})
    if top:
        run(top[module_function], namespace)
        fn = namespace[module_function]
        fn.__module__ = mod.__name__
        setattr(mod, module_function, fn)
    methods = definitions(source, {"__reduce_ex__", "_make_in_reduce_ex"}, inside=class_name)
    for name, src in methods.items():
        ns = dict(namespace)
        run(src, ns)
        setattr(cls, name, ns[name])
    return cls, fp8_dtype, ext_name


def write(repo, tag, out):
    import torch
    path, float8 = source_of(repo, tag, "transformer_engine/pytorch/tensor/float8_tensor.py",
                             "transformer_engine/pytorch/float8_tensor.py")
    if "class Float8Tensor" not in float8:  # a re-export only
        path, float8 = source_of(repo, tag, "transformer_engine/pytorch/tensor/float8_tensor.py")
    Float8Tensor, fp8_dtype, ext_name = stand_in(repo, tag, path, float8, "Float8Tensor",
                                                 "_make_float8_tensor_in_reduce_ex")

    def float8_tensor(codes, scale_inv):
        t = Float8Tensor.__new__(Float8Tensor)
        t._data, t._fp8_dtype, t._scale_inv = codes, fp8_dtype, scale_inv
        t._transpose, t.dtype, t.shape = None, torch.bfloat16, codes.shape
        return t

    k = torch.arange(8 * 16, dtype=torch.int32).reshape(8, 16)
    sd = {
        "experts.weight0": float8_tensor((k % 256).to(torch.uint8), torch.tensor([0.5])),
        "experts.weight1": float8_tensor(((k + 128) % 256).to(torch.uint8),
                                         torch.tensor([0.25])),
        "dense.weight": torch.arange(6, dtype=torch.float32).to(torch.bfloat16).reshape(2, 3),
    }
    torch.save(sd, out)
    print(f"{out}: TransformerEngine {tag} ({path}, {ext_name}.DType, float8 e4m3 = "
          f"{int(fp8_dtype)}), torch {torch.__version__}, {os.path.getsize(out)} bytes")


def main(script, doc, tags, write_one, kind):
    """`script TE_GIT_DIR [TAG ...]`: write_one(repo, tag, te<VERSION>_<kind>.pt) for each tag
    (default `tags`), each release in a process of its own: its modules must not meet."""
    if len(sys.argv) < 2:
        sys.exit(doc)
    repo, chosen = sys.argv[1], sys.argv[2:] or tags
    if len(chosen) > 1:
        for tag in chosen:
            subprocess.run([sys.executable, script, repo, tag], check=True)
        return
    tag = chosen[0]
    write_one(repo, tag, os.path.join(HERE, f"te{tag[1:].replace('.', '_')}_{kind}.pt"))


if __name__ == "__main__":
    main(__file__, __doc__, TAGS, write, "float8")
