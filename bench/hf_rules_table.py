#!/usr/bin/env python3
"""bench/hf_rules_table.py: GroupLin's table of model families against transformers' own.

transformers v5 keeps each model family's checkpoint conversions as data
(`transformers/conversion_mapping.py`: MergeModulelist + Concatenate for module lists of experts,
WeightRenaming for renames). GroupLin keeps its own table (src/layout/model_families.cpp, printed
by `grouplin rules --json`). This script derives the table from the installed transformers and
compares, model type by model type:

  - every MoE type of the mapping (a converter or rename that names experts) is in GroupLin's
    table, and every type of GroupLin's table that the mapping has is still there;
  - the structure: which per-expert projections (gate_proj/up_proj/down_proj, w1/w3/w2, ...)
    stack into which fused tensor;
  - the renames that are plain text (regular expressions are listed as not applied);
  - what GroupLin does not apply (regular-expression renames, conversions of other tensors).

A new transformers release then shows what changed. `--emit` prints the rows of
model_families.cpp that the installed transformers implies (families GroupLin handles by hand,
stacked on the Hub already, are kept as they are).

Needs the bench-only environment (transformers v5 from PyPI), which `make test` never downloads:

  python3 bench/hf_rules_table.py --grouplin build/grouplin    # exit 0: same; 1: differences
  python3 bench/hf_rules_table.py --emit
"""

import argparse
import json
import os
import re
import subprocess
import sys

from bench_env import have_transformers_v5, reexec_in_bench_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per-expert projections (gate, up), (down) -> GroupLin's structure.
STRUCTURES = {
    (("gate_proj", "up_proj"), ("down_proj",)): "hf",
    (("w1", "w3"), ("w2",)): "hf-w1w3",
    (("fc1", "fc3"), ("fc2",)): "hf-fc",
    (("up_proj",), ("down_proj",)): "hf-up-down",
}
# Families whose experts are stacked on the Hub already: GroupLin's rows for them are written by
# hand (their transformers entries are renames of stacked tensors, or absent).
BY_HAND = {"aria_text", "ergo", "granitemoe", "granitemoehybrid", "granitemoeshared", "gpt_oss", "llama4",
           "llama4_text", "dbrx", "gemma4_text", "granitemoe_swa", "hy_v4", "inkling_text", "jetmoe",
           "lara_mini", "minimax_m3_vl_text", "mistral4", "muse_spark_text",
           "openai_privacy_filter", "qwen3_vl_moe_text", "zaya"}
REGEX_CHARS = set("^$()[]|?*+{}\\")


def literal(pattern, anchor_ok=False):
    """The plain text a regular expression matches ("^text" when anchored at the start and
    `anchor_ok`), or None when it is more than that."""
    text = pattern.replace("\\.", ".")
    anchored = anchor_ok and text.startswith("^")
    body = text[1:] if anchored else text
    if not body or any(c in REGEX_CHARS for c in body):
        return None
    return ("^" if anchored else "") + body


def as_join(x, ops, src, tgt):
    """GroupLin's join ({"whole", "parts"}) for a Concatenate or Split along dim 0 of literal
    names, or ({"whole", "parts", "transposed"}) for a Transpose(0, 1) of one literal name, else
    None."""
    if ops == ["Transpose"] and len(src) == len(tgt) == 1:
        op = x.operations[0]
        names = [literal(tgt[0]), literal(src[0])]
        if {getattr(op, "dim0", None), getattr(op, "dim1", None)} != {0, 1} or None in names:
            return None
        return {"whole": names[0], "parts": names[1:], "transposed": True}
    if ops not in (["Concatenate"], ["Split"]) or getattr(x.operations[0], "dim", None) != 0:
        return None
    one, many = (tgt, src) if len(tgt) == 1 else (src, tgt)
    names = [literal(n) for n in list(one) + list(many)]
    if len(one) != 1 or len(many) < 2 or None in names:
        return None
    return {"whole": names[0], "parts": names[1:]}


def transformers_table():
    """model_type -> {"structure", "renames", "not_applied"} as the installed transformers says."""
    import transformers.conversion_mapping as cm
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    types = set(cm._MODEL_TO_CONVERSION_PATTERN) | set(cm._build_checkpoint_conversion_mapping())
    table = {}
    for t in sorted(types):
        if t != t.lower():  # class names (e.g. "Dots3NoteTextModel"), not config model types
            continue
        mapping = cm.get_checkpoint_conversion_mapping(t) or []
        moe = any("expert" in str(x.source_patterns) + str(x.target_patterns) for x in mapping)
        if not moe and t not in BY_HAND:
            continue
        parts, renames, not_applied, joins = [], [], [], []
        for x in mapping:
            ops = [type(o).__name__ for o in (getattr(x, "operations", None) or [])]
            src, tgt = x.source_patterns, x.target_patterns
            if isinstance(x, WeightConverter) and ops and ops[0] == "MergeModulelist":
                leafs = []
                for s in src:
                    m = re.match(r"^(?:\\?\.)?(.*)experts\.\*\.(\w+)\.weight$", s)
                    leafs.append(m.group(2) if m else "?" + s)
                parts.append(tuple(leafs))
            elif type(x) is WeightRenaming:
                a, b = literal(src[0], anchor_ok=True), literal(tgt[0])
                if a is not None and b is not None:
                    renames.append((a, b))
                else:
                    not_applied.append(f"rename {src[0]} -> {tgt[0]} (a regular expression)")
            else:
                kind = type(x).__name__ if type(x) is not WeightConverter else "+".join(ops)
                # A shared expert is a dense MLP beside the experts, not one of them.
                other = "" if re.search(r"(?<!shared_)expert", str(src) + str(tgt)) else \
                    "; not experts"
                join = as_join(x, ops, src, tgt)
                if other and join:
                    joins.append(join)
                not_applied.append(f"{', '.join(s.replace(chr(92) + '.', '.') for s in src)} -> "
                                   f"{', '.join(s.replace(chr(92) + '.', '.') for s in tgt)} "
                                   f"({kind}{other})")
        if t in BY_HAND:  # stacked on the Hub: the structure is GroupLin's, the renames theirs
            table[t] = {"structure": None, "renames": renames, "not_applied": "; ".join(not_applied),
                        "joins": joins}
            continue
        structure = STRUCTURES.get(tuple(parts))
        if structure == "hf-w1w3" and (".block_sparse_moe.", ".mlp.") in renames:
            structure = "hf-mixtral"
            renames.remove((".block_sparse_moe.", ".mlp."))
        table[t] = {"structure": structure, "renames": renames if structure else [],
                    "not_applied": "; ".join(not_applied), "joins": joins if structure else []}
    return table


def grouplin_table(grouplin):
    out = subprocess.run([grouplin, "rules", "--json"], check=True, capture_output=True,
                         text=True).stdout
    doc = json.loads(out)
    return doc, {f["model_type"]: f for f in doc["families"]}


def compare(grouplin):
    import transformers

    theirs = transformers_table()
    doc, ours = grouplin_table(grouplin)
    print(f"transformers {transformers.__version__}; GroupLin's table checked against "
          f"{doc['transformers_checked']}")
    problems = []
    for t, want in theirs.items():
        have = ours.get(t)
        if have is None:
            problems.append(f"{t}: in transformers' mapping, not in GroupLin's table")
            continue
        if have.get("structure") and have.get("joins", []) != want["joins"]:
            problems.append(f"{t}: joins {have.get('joins', [])} in GroupLin, {want['joins']} "
                            "from transformers")
        if t in BY_HAND:
            have_renames = [(r["from"], r["to"]) for r in have["renames"]]
            if have_renames != want["renames"]:
                problems.append(f"{t}: renames {have_renames} in GroupLin, {want['renames']} in "
                                "transformers")
            continue
        if want["structure"] is None:
            if have["structure"] is not None:
                problems.append(f"{t}: transformers' experts are no module list GroupLin knows, "
                                f"but GroupLin says {have['structure']}")
            continue
        if have["structure"] != want["structure"]:
            problems.append(f"{t}: structure {have['structure']} in GroupLin, "
                            f"{want['structure']} in transformers")
        have_renames = [(r["from"], r["to"]) for r in have["renames"]]
        if have_renames != want["renames"]:
            problems.append(f"{t}: renames {have_renames} in GroupLin, {want['renames']} in "
                            "transformers")
        if have["not_applied"] != want["not_applied"]:
            problems.append(f"{t}: not applied '{have['not_applied']}' in GroupLin, "
                            f"'{want['not_applied']}' from transformers")
    for t in ours:
        if t not in theirs and t not in BY_HAND:
            problems.append(f"{t}: in GroupLin's table, no longer in transformers' mapping")
    supported = sum(1 for f in ours.values() if f["structure"])
    print(f"{len(theirs)} MoE model types in transformers' mapping; GroupLin's table has "
          f"{len(ours)} ({supported} with rules)")
    for p in problems:
        print("  " + p)
    print("same" if not problems else f"{len(problems)} difference(s)")
    return 0 if not problems else 1


def cstr(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def emit():
    for t, row in transformers_table().items():
        if t in BY_HAND:
            print(f"    // {t}: by hand; transformers' renames: {row['renames']}")
            continue
        renames = ", ".join("{%s, %s}" % (cstr(a), cstr(b)) for a, b in row["renames"])
        print("    {%s, %s, {%s}, %s}," % (cstr(t), cstr(row["structure"] or ""), renames,
                                           cstr(row["not_applied"])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grouplin", default=os.path.join(ROOT, "build", "grouplin"))
    parser.add_argument("--emit", action="store_true",
                        help="print the rows of src/layout/model_families.cpp instead")
    args = parser.parse_args()
    reexec_in_bench_env("hf_rules_table", have_transformers_v5)
    if args.emit:
        emit()
        return 0
    return compare(args.grouplin)


if __name__ == "__main__":
    sys.exit(main())
