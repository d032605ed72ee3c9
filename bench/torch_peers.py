#!/usr/bin/env python3
"""bench/torch_peers.py: GroupLin's grouped GEMM against PyTorch's own paths, in one run.

For every case of `grouplin bench` (the same shapes, rows, routing: its JSON gives each case's
m_splits), times in interleaved rounds:

  grouplin        `grouplin bench --json` (GroupLin's GroupedLinear kernels; its own dense
                  OpenBLAS sgemm and per-expert loop come with it)
  grouped_mm      torch.nn.functional.grouped_mm (PyTorch >= 2.9; on the CPU a per-group loop)
  loop            a per-expert F.linear loop (forward), matmul loops (dgrad, wgrad)
  dense           one torch.matmul of the same FLOPs (T x in by in x out), the same dtype

in F32 and BF16, and reports GroupLin's GF/s over each PyTorch path's and over the best of
grouped_mm and loop (the goals of issue 13), per case, with the best time of the rounds.

With --isa, GroupLin runs once per kernel set named (GROUPLIN_ISA), one column each with the
set's fraction of its own peak (grouplin bench's vs_peak): the table of issue 22 in one run,
PyTorch's dense BF16 (oneDNN) beside every set.

Needs PyTorch >= 2.9: the bench-only environment (scripts/bench-env.sh, never used by make test):

  python3 bench/torch_peers.py --shapes qwen3,mixtral --rows 4096,16384 --rounds 3
  python3 bench/torch_peers.py --quick          # a seconds-long smoke run
  python3 bench/torch_peers.py --isa amx,avx512bf16,avx512,avx2 --rows 4096   # every set
  python3 bench/torch_peers.py --ops forward --pack-weights   # forward as an inference server runs it
"""

import argparse
import json
import os
import subprocess
import sys
import time

from bench_env import reexec_in_bench_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_torch_2_9():
    try:
        import torch

        return tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 9)
    except ImportError:
        return False


def best_time(fn, min_seconds=0.2, reps=3):
    """Best of `reps` timings of fn, each over as many calls as fill min_seconds (at least 1)."""
    fn()  # warm-up
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(min_seconds / reps / one))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def torch_case(case, dtype):
    """Seconds of each PyTorch path for one case of grouplin bench's JSON."""
    import torch
    import torch.nn.functional as F

    splits = case["m_splits"]
    n, k_in, k_out, rows = case["experts"], case["in"], case["out"], case["rows"]
    op = case["op"]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, k_in, generator=g).to(dtype)
    dy = torch.randn(rows, k_out, generator=g).to(dtype)
    w = torch.randn(n, k_out, k_in, generator=g).to(dtype)
    offs = torch.tensor(splits, dtype=torch.int64).cumsum(0).to(torch.int32)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    times = {}
    if op == "forward":
        wt = w.transpose(-2, -1)  # [N, in, out]
        times["grouped_mm"] = best_time(lambda: F.grouped_mm(x, wt, offs=offs))
        times["loop"] = best_time(lambda: [F.linear(x[a:b], w[e]) for e, (a, b) in
                                           enumerate(zip(starts, ends))])
        wd = w[0].t().contiguous()
        times["dense"] = best_time(lambda: torch.matmul(x, wd))
    elif op == "dgrad":
        times["grouped_mm"] = best_time(lambda: F.grouped_mm(dy, w, offs=offs))
        times["loop"] = best_time(lambda: [torch.matmul(dy[a:b], w[e]) for e, (a, b) in
                                           enumerate(zip(starts, ends))])
        wd = w[0].contiguous()
        times["dense"] = best_time(lambda: torch.matmul(dy, wd))
    elif op == "wgrad":
        dyt = dy.t()
        times["grouped_mm"] = best_time(lambda: F.grouped_mm(dyt, x, offs=offs))
        times["loop"] = best_time(lambda: [torch.matmul(dyt[:, a:b], x[a:b]) for a, b in
                                           zip(starts, ends)])
        times["dense"] = best_time(lambda: torch.matmul(dyt, x))
    return times


def main():
    reexec_in_bench_env("torch_peers", have_torch_2_9)
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grouplin", default=os.path.join(ROOT, "build", "grouplin"))
    ap.add_argument("--shapes", default="qwen3,mixtral")
    ap.add_argument("--rows", default="2048,4096,16384")
    ap.add_argument("--routing", default="uniform,skewed")
    ap.add_argument("--ops", default="forward,dgrad,wgrad")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="qwen3, 512 rows, forward, one round")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--isa", default="",
                    help="kernel sets to run GroupLin with, one GF/s column each (GROUPLIN_ISA "
                         "values: amx,avx512bf16,avx512,avx2); the first is the one compared with "
                         "PyTorch. Default: the CPU's own choice")
    ap.add_argument("--pack-weights", action="store_true",
                    help="GroupLin's BF16 forward reads weights packed once beforehand "
                         "(GroupedLinear weight packing, for inference)")
    args = ap.parse_args()
    if args.quick:
        args.shapes, args.rows, args.routing, args.ops, args.rounds = (
            "qwen3", "512", "uniform", "forward", 1)
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    cmd = [args.grouplin, "bench", "--json", "--shapes", args.shapes, "--rows", args.rows,
           "--routing", args.routing, "--ops", args.ops, "--reps", "2", "--threads", str(threads)]
    if args.pack_weights:
        cmd.append("--pack-weights")
    isas = args.isa.split(",") if args.isa else [""]
    best = {}  # (case key, path, dtype) -> GF/s, best of the rounds
    peak_share = {}  # (case key, isa, dtype) -> the set's fraction of its own peak, at its best
    cases = {}
    machine = None
    for r in range(args.rounds):
        for n, isa in enumerate(isas):
            env = dict(os.environ, GROUPLIN_ISA=isa) if isa else None
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                            env=env).stdout)
            if n == 0:
                machine = {k: out.get(k) for k in ("machine", "kernels", "peak")}
            for case in out["results"]:
                key = (case["shape"], case["rows"], case["routing"], case["op"])
                cases[key] = case
                for dt in ("f32", "bf16"):
                    if dt not in case:
                        continue
                    path = "grouplin" if n == 0 else "grouplin:" + isa
                    v = case[dt]["grouplin_gflops"]
                    if v > best.get((key, path, dt), 0.0):
                        best[(key, path, dt)] = v
                        peak_share[(key, isa, dt)] = case[dt].get("vs_peak", 0.0)
        for key, case in cases.items():
            flops = 2.0 * case["rows"] * case["in"] * case["out"]
            for dt, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                if dt not in case:
                    continue
                for p, t in torch_case(case, dtype).items():
                    best[(key, p, dt)] = max(best.get((key, p, dt), 0.0), flops / t / 1e9)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    print(f"torch {torch.__version__}, {threads} threads; grouplin kernels "
          f"{machine and machine.get('kernels')}; best of {args.rounds} interleaved rounds, GF/s\n")
    others = [i for i in isas[1:]]
    first = f"GroupLin {isas[0]}" if isas[0] else "GroupLin"
    print(f"| shape | rows | routing | op | dtype | {first} (x own peak) | "
          + "".join(f"GroupLin {i} (x own peak) | " for i in others)
          + "grouped_mm | loop | dense | GroupLin / best PyTorch path | GroupLin / PyTorch dense |")
    print("|---|---|---|---|---|---|" + "---|" * len(others) + "---|---|---|---|---|")
    rows = []
    for key in sorted(cases):
        for dt in ("f32", "bf16"):
            if (key, "grouplin", dt) not in best:
                continue
            f = {p: best[(key, p, dt)] for p in ("grouplin", "grouped_mm", "loop", "dense")}
            vs_best = f["grouplin"] / max(f["grouped_mm"], f["loop"])
            vs_dense = f["grouplin"] / f["dense"]
            sets = {i: (best.get((key, "grouplin:" + i, dt), 0.0),
                        peak_share.get((key, i, dt), 0.0)) for i in others}
            rows.append({"shape": key[0], "rows": key[1], "routing": key[2], "op": key[3],
                         "dtype": dt, **f, "vs_best_torch_path": vs_best,
                         "vs_torch_dense": vs_dense,
                         "vs_own_peak": peak_share.get((key, isas[0], dt), 0.0),
                         "other_sets": {i: {"gflops": g, "vs_own_peak": k}
                                        for i, (g, k) in sets.items()}})
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {dt} | {f['grouplin']:.1f} "
                  f"({peak_share.get((key, isas[0], dt), 0.0):.2f}) | "
                  + "".join(f"{g:.1f} ({k:.2f}) | " for g, k in sets.values())
                  + f"{f['grouped_mm']:.1f} | {f['loop']:.1f} | {f['dense']:.1f} | "
                  f"{vs_best:.2f}x | {vs_dense:.2f}x |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"torch": torch.__version__, "threads": threads, "machine": machine,
                       "rounds": args.rounds, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
