#!/usr/bin/env python3
"""bench/gemm_sweep.py: GroupLin's grouped GEMM against PyTorch and OpenBLAS by rows per expert.

For each shape (experts x in x out) and each count of rows per expert, times forward
(y = x·Wᵀ), dgrad (dx = dy·W) and wgrad (dW = dyᵀ·x), in F32 and BF16, in interleaved rounds
(every implementation once per round, the order rotating), and reports GF/s:

  grouplin     grouplin.torch's stateless grouped GEMM (the kernels GroupedLinear runs)
  grouped_mm   torch.nn.functional.grouped_mm (on the CPU a per-group loop)
  loop         a per-expert torch.matmul loop
  dense        one torch.matmul of the same FLOPs, the same dtype (oneDNN for BF16)
  openblas     one numpy matmul of the same FLOPs (F32; numpy's OpenBLAS)

Each figure is the best time of a round; a ratio "holds" when it holds in every round, so the
table gives GroupLin's ratio to dense in its worst round beside the ratio of the best times. The
set's fraction of its peak uses `grouplin bench`'s peak (its clock measured with every thread busy).

With --plot FILE.png it draws GF/s against rows per expert, one line per implementation, one
panel per shape x op x dtype. Needs PyTorch >= 2.9 and matplotlib (scripts/bench-env.sh):

  python3 bench/gemm_sweep.py --rows 4,16,32,64,128,256 --rounds 3 --plot docs/gemm_sweep.png
  python3 bench/gemm_sweep.py --shapes mixtral-s --rows 256 --ops forward --dtypes bf16
"""

import argparse
import json
import os
import subprocess
import sys
import time

from bench_env import reexec_in_bench_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# experts, in, out: the shapes of issue 43's table (full-size Qwen3-30B-A3B up and down
# projections, Mixtral's hidden size with a quarter of its ffn).
SHAPES = {
    "qwen3-up": (128, 2048, 768),
    "qwen3-down": (128, 768, 2048),
    "mixtral-s": (8, 4096, 1024),
}


def ready():
    try:
        import matplotlib  # noqa: F401
        import torch

        return tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 9)
    except ImportError:
        return False


def timed(fn, min_seconds):
    """Best time of fn over calls filling min_seconds (after one warm-up call)."""
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_seconds or best == float("inf"):
        start = time.perf_counter()
        fn()
        t = time.perf_counter() - start
        best, spent = min(best, t), spent + t
    return best


def splits_of(routing, experts, rows_per_expert):
    """m_splits: uniform, or skewed (half the rows to expert 0, the rest spread evenly)."""
    total = experts * rows_per_expert
    if routing == "uniform":
        return [rows_per_expert] * experts
    first = total // 2
    rest = total - first
    n = experts - 1
    return [first] + [rest // n + (1 if i < rest % n else 0) for i in range(n)]


def implementations(op, dtype, x, dy, w, splits):
    """name -> callable for one case; every callable computes the same product."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    import grouplin.torch as gt

    ends = torch.tensor(splits).cumsum(0).tolist()
    starts = [0] + ends[:-1]
    offs = torch.tensor(ends, dtype=torch.int32)
    fns = {}
    if op == "forward":
        wt = w.transpose(-2, -1)
        fns["grouplin"] = lambda: gt._grouped_forward(x, splits, [w], [None], [None])
        fns["grouped_mm"] = lambda: F.grouped_mm(x, wt, offs=offs)
        fns["loop"] = lambda: [torch.matmul(x[a:b], wt[e]) for e, (a, b) in
                               enumerate(zip(starts, ends))]
        wd = w[0].t().contiguous()
        fns["dense"] = lambda: torch.matmul(x, wd)
        a_np, b_np = x, wd
    elif op == "dgrad":
        fns["grouplin"] = lambda: gt._grouped_backward(x, dy, splits, [w], [None], [None],
                                                       True, False, False)
        fns["grouped_mm"] = lambda: F.grouped_mm(dy, w, offs=offs)
        fns["loop"] = lambda: [torch.matmul(dy[a:b], w[e]) for e, (a, b) in
                               enumerate(zip(starts, ends))]
        wd = w[0].contiguous()
        fns["dense"] = lambda: torch.matmul(dy, wd)
        a_np, b_np = dy, wd
    else:
        dyt = dy.t()
        fns["grouplin"] = lambda: gt._grouped_backward(x, dy, splits, [w], [None], [None],
                                                       False, True, False)
        fns["grouped_mm"] = lambda: F.grouped_mm(dyt, x, offs=offs)
        fns["loop"] = lambda: [torch.matmul(dyt[:, a:b], x[a:b]) for a, b in
                               zip(starts, ends)]
        fns["dense"] = lambda: torch.matmul(dyt, x)
        a_np, b_np = dyt.contiguous(), x
    if dtype == torch.float32:
        an, bn = a_np.numpy(), b_np.numpy()
        fns["openblas"] = lambda: np.matmul(an, bn)
    return fns


def machine_peak():
    """grouplin bench's machine line, kernel set and peak (GF/s per dtype)."""
    exe = os.path.join(ROOT, "build", "grouplin")
    try:
        out = json.loads(subprocess.run([exe, "bench", "--quick", "--json"], check=True,
                                        capture_output=True, text=True).stdout)
        return out.get("machine"), out.get("kernels"), out["peak"]
    except (OSError, subprocess.CalledProcessError, KeyError, ValueError):
        return None, None, {}


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["shape"], r["op"], r["dtype"]) for r in results},
                    key=lambda p: (p[2], p[0], ["forward", "dgrad", "wgrad"].index(p[1])))
    cols = 3
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (shape, op, dt) in zip(axes.flat, panels):
        rows = [r for r in results if (r["shape"], r["op"], r["dtype"]) == (shape, op, dt)]
        for impl in ("grouplin", "grouped_mm", "loop", "dense", "openblas"):
            pts = sorted((r["rows_per_expert"], r["gflops"][impl]) for r in rows
                         if impl in r["gflops"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        linewidth=2.5 if impl == "grouplin" else 1.2, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{shape} {op} {dt} ({rows[0]['routing']})", fontsize=10)
        ax.set_xlabel("rows per expert")
        ax.set_ylabel("GF/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    reexec_in_bench_env("gemm_sweep", ready)
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-up,qwen3-down,mixtral-s")
    ap.add_argument("--rows", default="1,4,16,32,64,128,256", help="rows per expert")
    ap.add_argument("--routing", default="uniform", choices=["uniform", "skewed"])
    ap.add_argument("--ops", default="forward,dgrad,wgrad")
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.3, help="timing per implementation")
    ap.add_argument("--only", default="", help="implementations to run (default: all)")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--plot", help="draw GF/s against rows per expert into this PNG")
    args = ap.parse_args()

    threads = os.cpu_count()
    torch.set_num_threads(threads)
    machine, kernels, peak = machine_peak()
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    only = set(args.only.split(",")) if args.only else None
    cases = []
    for shape in args.shapes.split(","):
        experts, k_in, k_out = SHAPES[shape]
        for rows in [int(r) for r in args.rows.split(",")]:
            for dt in args.dtypes.split(","):
                for op in args.ops.split(","):
                    cases.append((shape, experts, k_in, k_out, rows, dt, op))

    results = []
    for shape, experts, k_in, k_out, rows, dt, op in cases:
        splits = splits_of(args.routing, experts, rows)
        total = sum(splits)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(total, k_in, generator=g).to(dtypes[dt])
        dy = torch.randn(total, k_out, generator=g).to(dtypes[dt])
        w = (torch.randn(experts, k_out, k_in, generator=g) * 0.05).to(dtypes[dt])
        fns = implementations(op, dtypes[dt], x, dy, w, splits)
        if only:
            fns = {k: v for k, v in fns.items() if k in only or k == "grouplin"}
        names = list(fns)
        per_round = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                per_round[n].append(timed(fns[n], args.seconds))
        flops = 2.0 * total * k_in * k_out
        gf = {n: flops / min(ts) / 1e9 for n, ts in per_round.items()}
        row = {"shape": shape, "experts": experts, "in": k_in, "out": k_out,
               "rows_per_expert": rows, "routing": args.routing, "dtype": dt, "op": op,
               "gflops": gf}
        if "dense" in per_round:
            row["vs_dense_worst_round"] = min(d / g_ for g_, d in
                                              zip(per_round["grouplin"], per_round["dense"]))
        pk = peak.get(f"{dt}_gflops", 0.0)
        row["vs_peak"] = gf["grouplin"] / pk if pk else 0.0
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    print(f"{machine}; kernels {kernels}; torch {torch.__version__}, {threads} threads; "
          f"{args.routing} routing; best of {args.rounds} interleaved rounds, GF/s; peak "
          f"F32 {peak.get('f32_gflops', 0):.0f}, BF16 {peak.get('bf16_gflops', 0):.0f} GF/s (clock "
          f"{peak.get('clock_ghz', 0):.2f} GHz, {peak.get('clock_source', 'unknown')})\n")
    print("| shape | rows/expert | op | dtype | GroupLin (x peak) | grouped_mm | loop | dense | "
          "OpenBLAS | / dense (worst round) | / OpenBLAS | / best grouped path |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["gflops"]
        best_grouped = max(f.get("grouped_mm", 0.0), f.get("loop", 0.0))
        vs_dense = f["grouplin"] / f["dense"] if f.get("dense") else 0.0
        blas = f"{f['openblas']:.0f}" if "openblas" in f else "—"
        vs_blas = f"{f['grouplin'] / f['openblas']:.2f}x" if f.get("openblas") else "—"
        print(f"| {r['shape']} | {r['rows_per_expert']} | {r['op']} | {r['dtype']} | "
              f"{f['grouplin']:.0f} ({r['vs_peak']:.2f}) | {f.get('grouped_mm', 0):.0f} | "
              f"{f.get('loop', 0):.0f} | {f.get('dense', 0):.0f} | {blas} | "
              f"{vs_dense:.2f}x ({r.get('vs_dense_worst_round', 0):.2f}x) | {vs_blas} | "
              f"{f['grouplin'] / best_grouped if best_grouped else 0:.2f}x |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, "kernels": kernels, "peak": peak,
                       "torch": torch.__version__, "threads": threads, "rounds": args.rounds,
                       "results": results}, fh, indent=2)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
