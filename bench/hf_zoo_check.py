#!/usr/bin/env python3
"""bench/hf_zoo_check.py: GroupLin against every Mixture-of-Experts family transformers v5 builds.

The model zoo check (issue 19, item 8), a generalisation of bench/hf_v5_check.py. For each MoE
model_type of FAMILIES (bench/hf_zoo_families.py: every type of transformers' conversion
mapping whose experts it merges from a module list, and every family whose model holds stacked
experts anyway, that builds on a CPU with a tiny config; NOT_BUILT says why the others are left
out):

  1. builds a tiny random model (hidden 32, 2 layers with at least one MoE layer, 4 experts,
     float32, seed 0), with the causal-LM class where there is one, else the base model;
  2. saves it twice with transformers itself: `save_original_format=True` (the Hub form:
     per-expert module lists where the family has them) into DIR/<type>/hub and `False` (v5's
     in-memory fused form) into DIR/<type>/v5;
  3. for each source (hub, v5) and layout (single, per-expert), `grouplin convert SRC
     DIR/<type>/out-<source>-<layout> --layout L` (config.json's model_type picks the rules),
     then loads the output back with from_pretrained (same class) and checks: no missing,
     unexpected or mismatched keys, every state_dict entry bit-identical to the original model's
     (same dtype), logits on a fixed input bit-identical, and the experts in the layout asked
     for. A family whose Hub form is stacked already (no `experts.<E>.` keys: Llama 4, gpt-oss,
     GraniteMoE, DBRX, ...) has no per-expert form: there `--layout per-expert` must be refused
     with `NoPerExpertForm` (exit 2), and `--layout per-expert --rules te` is run too (recorded
     only; transformers is not expected to load TE names), its output converted back with
     `--layout single` and compared byte for byte with the source;
  4. `grouplin verify hub v5` must exit 0 (the same model under the family's renames);
  5. `grouplin inspect --json` of both forms: the grouped modules found, and no tensor that is
     not an expert's (a conv1d, mamba or linear-attention weight, a shared expert) claimed by one;
  6. any grouplin command ending by a signal or with an exit code above 2 is a crash: a failure.

transformers' own round trip (loading its hub and v5 saves back) is checked first, so that a
problem of transformers is not counted as GroupLin's. Logits are compared after copying the
loaded weights to fresh memory: PyTorch's CPU kernels round the last bit differently for
weights mapped from a safetensors file at 8-byte-aligned offsets.

Prints a markdown table, one row per family (`--markdown FILE` writes it too), and the types it
does not build. Exit 0 only when every family meets the goal (every cell ok, or the expected
refusal), else 1. All 69 families take about 30 seconds on 2 cores.

Needs the bench-only environment (PyTorch 2.x and transformers v5 from PyPI), which `make test`
never downloads:

  python3 bench/hf_zoo_check.py                       # creates .bench-venv on first use
  python3 bench/hf_zoo_check.py --grouplin build/grouplin --keep /tmp/zoo --markdown zoo.md
  python3 bench/hf_zoo_check.py --families mixtral,llama4_text,qwen3_next
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from bench_env import have_transformers_v5, reexec_in_bench_env
from hf_zoo_families import FAMILIES, NOT_BUILT, model_class, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INPUT_IDS = [3, 17, 5, 42, 9, 28, 11, 60, 7, 33, 21, 2]
PER_EXPERT_KEY = re.compile(r"(^|\.)experts\.\d+\.")
# Expert tensors by name: under `experts.`, or GraniteMoE's and JetMoE's stacked
# `block_sparse_moe.input_linear` / `mlp.input_linear` (not `shared_mlp.input_linear`: dense), or
# Ergo's stacked `feed_forward.up_proj` / `down_proj` (its dense MLP's are `feed_forward.up.weight`).
EXPERT_KEY = re.compile(r"(^|\.)experts\.|\.(block_sparse_moe|mlp)\.(input|output)_linear\."
                        r"|\.feed_forward\.(up|down)_proj$")
NOT_EXPERT_HINT = re.compile(r"conv|mamba|linear_attn|mixer\.(?!experts)|shared_expert|shared_mlp"
                             r"|self_attn|attention|embed|norm|lm_head")
OK = "ok"
REFUSED = "refused (NoPerExpertForm)"


# --- building and saving ----------------------------------------------------------------------


def forward(model):
    """The logits (or last hidden state) on INPUT_IDS. Parameters and buffers are first copied
    to fresh memory: a model loaded from safetensors holds views of the mapped file, at offsets
    only 8-byte aligned, and PyTorch's CPU kernels round differently at different alignments
    (the last bit of some logits, with bit-identical weights)."""
    import torch

    for t in list(model.parameters()) + list(model.buffers()):
        t.data = t.data.clone()
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.tensor([[i % vocab for i in INPUT_IDS]])
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def expert_modules(model):
    """Names of the modules that hold stacked expert tensors (rank 3 under `experts`; DBRX
    stacks them as rank 2, [N * I, H])."""
    return sorted({n.rsplit(".", 1)[0] for n, p in model.named_parameters()
                   if EXPERT_KEY.search(n) and (p.dim() == 3 or
                                                 (p.dim() == 2 and ".experts.mlp." in n))})


# --- reading checkpoints ----------------------------------------------------------------------


def headers(directory):
    """name -> (dtype, shape) of every tensor of a directory's safetensors files."""
    from safetensors import safe_open

    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="pt") as f:
                for k in f.keys():
                    s = f.get_slice(k)
                    out[k] = (s.get_dtype(), tuple(s.get_shape()))
    return out


def tensors(directory):
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out


def same_tensors(a, b):
    """Differences between two name -> tensor dicts (names, dtypes, shapes, bytes)."""
    import torch

    problems = [f"only in the first: {k}" for k in sorted(set(a) - set(b))]
    problems += [f"only in the second: {k}" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{k}: {x.dtype} {list(x.shape)} vs {y.dtype} {list(y.shape)}")
        elif not torch.equal(x.contiguous().reshape(-1).view(torch.uint8),
                             y.contiguous().reshape(-1).view(torch.uint8)):
            problems.append(f"{k}: different bytes")
    return problems


# --- grouplin ---------------------------------------------------------------------------------


class Run:
    def __init__(self, cmd, log):
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.rc, self.stdout, self.stderr = r.returncode, r.stdout, r.stderr
        log.append(f"$ {' '.join(cmd)}  -> exit {self.rc} ({time.time() - t0:.2f} s)")
        if self.stderr.strip():
            log.extend("    " + line for line in self.stderr.strip().splitlines()[:6])

    @property
    def crashed(self):
        return self.rc < 0 or self.rc > 2

    def code(self):
        m = re.search(r"grouplin: (\w+):", self.stderr)
        return m.group(1) if m else ""

    def why(self):
        if self.rc < 0:
            return f"CRASH (signal {-self.rc})"
        if self.crashed:
            return f"CRASH (exit {self.rc})"
        code = self.code()
        return f"exit {self.rc}" + (f" ({code})" if code else "")


def short(text, n=70):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


# --- one family -------------------------------------------------------------------------------


class Family:
    COLUMNS = ["hub→single", "hub→per-expert", "v5→single", "v5→per-expert",
               "verify hub v5", "inspect modules (hub/v5)"]

    def __init__(self, model_type):
        self.model_type = model_type
        self.cells = {c: "" for c in self.COLUMNS}
        self.notes = []
        self.failed = False
        self.log = []

    def cell(self, column, text, ok):
        self.cells[column] = text
        if not ok:
            self.failed = True

    def row(self):
        notes = "; ".join(self.notes)
        return [self.model_type] + [self.cells[c] or "-" for c in self.COLUMNS] + [notes]


def check_family(model_type, args, base):
    import torch

    fam = Family(model_type)
    where = os.path.join(base, model_type)
    if os.path.isdir(where):
        shutil.rmtree(where)
    os.makedirs(where)
    cls = model_class(model_type)
    try:
        torch.manual_seed(0)
        model = cls.from_config(tiny_config(model_type), dtype=torch.float32).eval()
        moe = expert_modules(model)
        if not moe:
            raise RuntimeError("no MoE layer in the tiny model")
        want_logits = forward(model)
        if not torch.equal(forward(model), want_logits):
            fam.notes.append("forward not deterministic: logits not compared")
            want_logits = None
        want = {k: v.detach().clone() for k, v in model.state_dict().items()}
        hub, v5 = os.path.join(where, "hub"), os.path.join(where, "v5")
        model.save_pretrained(hub, save_original_format=True)
        model.save_pretrained(v5, save_original_format=False)
    except Exception as e:  # a family that does not build is a failure of this check's config
        fam.cell("hub→single", f"build failed: {short(f'{type(e).__name__}: {e}', 90)}", False)
        return fam
    hub_h, v5_h = headers(hub), headers(v5)
    stacked_only = not any(PER_EXPERT_KEY.search(k) for k in hub_h)
    fam.stacked_only = stacked_only
    fam.notes.append(f"{type(model).__name__}, {len(moe)} expert module(s)" +
                     (", Hub form stacked" if stacked_only else "") +
                     (" (= v5 form)" if hub_h == v5_h else ""))
    # transformers' own round trip first: a problem there is not GroupLin's
    for form, path in (("hub", hub), ("v5", v5)):
        problems = load_and_compare(fam, cls, path, want, want_logits)
        if problems:
            fam.notes.append(f"transformers' own {form} save does not load back: "
                             + short(", ".join(problems), 60))
            fam.failed = True

    g = args.grouplin
    for source, src in (("hub", hub), ("v5", v5)):
        for layout in ("single", "per-expert"):
            column = f"{source}→{layout}"
            out = os.path.join(where, f"out-{source}-{layout}")
            r = Run([g, "convert", src, out, "--layout", layout, "--quiet"], fam.log)
            if r.rc == 2 and "NoPerExpertForm" in r.stderr:
                expected = stacked_only and layout == "per-expert"
                fam.cell(column, REFUSED if expected else "unexpected " + REFUSED, expected)
            elif r.rc != 0:
                fam.cell(column, r.why(), False)
            elif stacked_only and layout == "per-expert":  # should have been refused
                text, _ = check_output(fam, cls, out, layout, want, want_logits, hub_h)
                fam.cell(column, "exit 0, not refused" +
                         (" (experts left stacked; loads)" if text == OK and
                          headers(out) == headers(src) else f": {text}"), False)
            else:
                fam.cell(column, *check_output(fam, cls, out, layout, want, want_logits,
                                               hub_h if layout == "per-expert" else v5_h))
            if stacked_only and layout == "per-expert":
                te_round_trip(fam, g, source, src, v5, where)

    r = Run([g, "verify", hub, v5], fam.log)
    if r.rc == 0:
        fam.cell("verify hub v5", OK, True)
    elif r.rc == 1:
        text = r.stdout + r.stderr
        m = re.search(r"(\d+) entr(y|ies) differ", text)
        first = next((ln.strip() for ln in text.splitlines() if ln.startswith("  ")), "")
        fam.cell("verify hub v5", f"differ: {m.group(0) if m else 'exit 1'}"
                 + (f", e.g. {short(first, 70)}" if first else ""), False)
    else:
        fam.cell("verify hub v5", r.why(), False)

    check_inspect(fam, g, hub, v5)
    return fam


def load_and_compare(fam, cls, path, want, want_logits):
    """Loads a checkpoint directory with transformers (the class the model was built with) and
    compares it with the original model: the problems found, [] when it is the same model."""
    import torch

    name = os.path.basename(path)
    try:
        model, info = cls.from_pretrained(path, output_loading_info=True)
        model.eval()
    except Exception as e:
        return ["load failed: " + short(f"{type(e).__name__}: {e}", 60)]
    problems = []
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(info.get(what) or [], key=str)
        if keys:
            problems.append(f"{len(keys)} {what.replace('_keys', '')}")
            fam.log.append(f"    {name} {what}: {keys[:8]}")
    if info.get("error_msgs"):
        problems.append("load errors")
        fam.log.append(f"    {name} error_msgs: {info['error_msgs'][:3]}")
    got = model.state_dict()
    differ = []
    for k in sorted(set(want) | set(got)):
        a, b = want.get(k), got.get(k)
        if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape \
                or not torch.equal(a, b):
            differ.append(k)
    if differ:
        problems.append(f"{len(differ)} params differ")
        fam.log.append(f"    {name} params differing: {differ[:8]}")
    if not problems and want_logits is not None and not torch.equal(forward(model), want_logits):
        problems.append("logits differ")
    return problems


def check_output(fam, cls, out, layout, want, want_logits, reference_h):
    """A grouplin output: the experts in the layout asked for, and transformers loads it as the
    original model."""
    out_h = headers(out)
    # transformers would load either layout: this catches a conversion that left them as they were
    if layout == "single" and any(PER_EXPERT_KEY.search(k) for k in out_h):
        n = sum(1 for k in out_h if PER_EXPERT_KEY.search(k))
        return f"not single: {n} per-expert keys left", False
    if layout == "per-expert" and not fam.stacked_only:
        missing = sorted(k for k in reference_h if PER_EXPERT_KEY.search(k) and k not in out_h)
        if missing:
            wrote = sorted(k for k in out_h if PER_EXPERT_KEY.search(k) and k not in reference_h)
            tail = lambda k: re.sub(r"^.*?(layers|blocks)\.\d+\.", "", k)  # noqa: E731
            return f"{len(missing)} Hub per-expert names missing: " + (
                f"wrote {tail(wrote[0])}, ...; the Hub has {tail(missing[0])}" if wrote
                else f"e.g. {tail(missing[0])}"), False
    problems = load_and_compare(fam, cls, out, want, want_logits)
    if problems:
        return short(", ".join(problems), 60), False
    diff_names = sorted(set(out_h) ^ set(reference_h))
    if diff_names:  # loads as the original model, under other names than transformers' own save
        form = "v5's" if layout == "single" else "the Hub's"
        fam.notes.append(f"{os.path.basename(out)} loads, but {len(diff_names)} names differ "
                         f"from {form} save, e.g. {short(diff_names[0], 60)}")
    return OK, True


def te_round_trip(fam, g, source, src, v5, where):
    """Stacked-only family: per-expert with TransformerEngine names, then back to single, which
    must be byte for byte the direct conversion to single (out-<source>-single, which is loaded
    into transformers), or v5's save where there is none. The direct conversion, not v5's save:
    convert leaves the tensors that are not experts as they are, and transformers splits some
    (lara_mini's linear_attn.in_proj)."""
    te = os.path.join(where, f"out-{source}-per-expert-te")
    r = Run([g, "convert", src, te, "--layout", "per-expert", "--rules", "te", "--quiet"],
            fam.log)
    if r.crashed:
        fam.notes.append(f"{source} per-expert --rules te: {r.why()}")
        fam.failed = True
        return
    if r.rc != 0:
        fam.notes.append(f"{source} per-expert --rules te: {r.why()} (recorded)")
        return
    back = te + "-single"
    b = Run([g, "convert", te, back, "--layout", "single", "--quiet"], fam.log)
    if b.rc != 0:
        fam.notes.append(f"{source} --rules te: exit 0, back to single: {b.why()}")
        fam.failed = True
        return
    direct = os.path.join(where, f"out-{source}-single")
    reference, what = (direct, f"out-{source}-single") if os.path.isdir(direct) else (v5, "v5's save")
    problems = same_tensors(tensors(back), tensors(reference))
    if problems:
        fam.notes.append(f"{source} --rules te: exit 0, back to single: {len(problems)} "
                         f"differences from {what} ({short(problems[0], 50)})")
        fam.failed = True
        fam.log.extend("    " + p for p in problems[:10])
    else:
        n = sum(1 for k in headers(te) if k not in headers(src))
        fam.notes.append(f"{source} --rules te: exit 0 ({n} TE-named keys), back to single: "
                         f"identical to {what}")


def check_inspect(fam, g, hub, v5):
    counts, problems = [], []
    for form, path in (("hub", hub), ("v5", v5)):
        r = Run([g, "inspect", path, "--json"], fam.log)
        if r.crashed:
            counts.append("?")
            problems.append(f"{form}: {r.why()}")
            continue
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            counts.append("?")
            problems.append(f"{form}: {r.why()}, no JSON")
            continue
        modules = doc.get("grouped_modules", [])
        counts.append(str(len(modules)))
        shapes = {t["name"]: t["shape"] for t in doc.get("tensors", [])}
        claimed = [k for m in modules for k in m.get("keys", []) if not EXPERT_KEY.search(k)]
        if claimed:
            hint = [k for k in claimed if NOT_EXPERT_HINT.search(k)] or claimed
            problems.append(f"{form}: claims {len(claimed)} non-expert tensors, e.g. "
                            f"{hint[0]} {shapes.get(hint[0], '')}")
            fam.log.append(f"    inspect {form}: non-expert keys in grouped modules: {claimed[:8]}")
        expert_keys = {k for k in shapes if EXPERT_KEY.search(k)}
        in_modules = {k for m in modules for k in m.get("keys", [])}
        unclaimed = sorted(expert_keys - in_modules)
        if unclaimed:
            fam.notes.append(f"inspect {form}: {len(unclaimed)} expert tensors in no grouped "
                             f"module, e.g. {short(unclaimed[0], 60)} {shapes[unclaimed[0]]}")
        if r.rc != 0:
            codes = sorted({p.get("code", "?") for p in doc.get("problems", [])})
            problems.append(f"{form}: {r.why()}" + (f" {','.join(codes)}" if codes else ""))
    text = "/".join(counts)
    if problems:
        fam.cell("inspect modules (hub/v5)", text + ": " + "; ".join(problems), False)
    else:
        fam.cell("inspect modules (hub/v5)", f"{OK} {text}", True)


# --- report -----------------------------------------------------------------------------------


def markdown(families):
    head = ["model_type"] + Family.COLUMNS + ["notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fam in families:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in fam.row()) + " |")
    return "\n".join(lines) + "\n"


def main():
    reexec_in_bench_env("hf_zoo_check", have_transformers_v5)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grouplin", default=os.path.join(ROOT, "build", "grouplin"))
    ap.add_argument("--keep", metavar="DIR",
                    help="write the fixtures and outputs under DIR/<model_type>/ (hub, v5, "
                         "out-<source>-<layout>) and keep them (default: a temporary directory)")
    ap.add_argument("--families", help="comma-separated model types (default: all of FAMILIES)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    ap.add_argument("--verbose", action="store_true", help="print every command and its stderr")
    args = ap.parse_args()

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    args.grouplin = os.path.abspath(args.grouplin)
    if not os.access(args.grouplin, os.X_OK):
        sys.exit(f"hf_zoo_check: no grouplin at {args.grouplin} (build it, or pass --grouplin)")
    names = [f.strip() for f in args.families.split(",") if f.strip()] if args.families \
        else list(FAMILIES)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    unknown = [n for n in names if n not in CONFIG_MAPPING]
    if unknown:
        sys.exit(f"hf_zoo_check: transformers {transformers.__version__} has no model type "
                 f"{', '.join(unknown)}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"grouplin {args.grouplin}")
    tmp = None
    if args.keep:
        base = os.path.abspath(args.keep)
        os.makedirs(base, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="hf_zoo_check.")
        base = tmp.name
    results = []
    try:
        for name in names:
            t0 = time.time()
            fam = check_family(name, args, base)
            results.append(fam)
            status = "FAIL" if fam.failed else "ok"
            print(f"{name}: {status} ({time.time() - t0:.1f} s)", flush=True)
            if args.verbose or fam.failed:
                for line in fam.log:
                    print("  " + line)
    finally:
        if tmp:
            tmp.cleanup()
    failed = [f.model_type for f in results if f.failed]
    table = markdown(results)
    if not args.families:
        table += "\nNot built:\n\n" + "".join(f"- {n}: {why}\n" for n, why in NOT_BUILT.items())
    table += (f"\n{len(results) - len(failed)} of {len(results)} families meet the goal"
              + (f"; failing: {', '.join(failed)}" if failed else "") + "\n")
    print()
    print(table, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"transformers {transformers.__version__}, torch {torch.__version__}, "
                    f"grouplin {args.grouplin}\n\n" + table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
