#!/usr/bin/env python3
"""bench/fp8_convert.py: converting an FP8 checkpoint, scales and all, and dequantizing it,
side by side with a plain copy in one run.

Builds a Hugging Face-style sharded directory of FP8 experts (DeepSeek-V3 / Qwen3-FP8 style:
`….weight` F8_E4M3 beside `….weight_scale_inv` F32 per [128, 128] block, Qwen names, every
expert's three projections in three different shards, an index, config.json; default 1 GiB,
64 experts per layer, H = 2048, I = 768), then times in interleaved rounds (a new random order
each round, `sync` before each job):

  cp -r DIR OUT + fsync of every file          the baseline
  grouplin convert DIR OUT --layout single     module lists -> fused experts, scales fused alike
  grouplin convert DIR OUT --layout single --dtype bf16
                                               the same, every FP8 weight written as BF16 values
                                               (twice the weight bytes out)

and prints the median seconds, the ratio of each conversion's time to the copy's, and the
dequantizing conversion's input and output GB/s.

  .venv/bin/python bench/fp8_convert.py --grouplin build/grouplin            # 1 GiB, 5 rounds
  .venv/bin/python bench/fp8_convert.py --size-gib 2 --rounds 7
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert import dir_bytes, fsync_tree, make_hf_dir  # noqa: E402


def timed(cmd):
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grouplin", default="build/grouplin")
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to build the input (default: build/)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="fp8-bench-", dir=args.dir or "build")
    src = os.path.join(root, "fp8")
    layers, total = make_hf_dir(src, args.size_gib, 64, 2048, 768, 4, fp8=True)
    out = os.path.join(root, "out")
    print(f"input: {layers} layers, {total / 1e9:.2f} GB in 4 shards; load {os.getloadavg()[0]:.2f}")

    def copy():
        subprocess.run(["sync"], check=True)
        start = time.perf_counter()
        subprocess.run(["cp", "-r", src, out], check=True)
        fsync_tree(out)
        return time.perf_counter() - start

    jobs = {
        "cp -r + fsync": copy,
        "convert --layout single": lambda: timed(
            [args.grouplin, "convert", src, out, "--layout", "single", "--quiet"]),
        "convert --layout single --dtype bf16": lambda: timed(
            [args.grouplin, "convert", src, out, "--layout", "single", "--dtype", "bf16",
             "--quiet"]),
    }
    times = {k: [] for k in jobs}
    out_bytes = {}
    rng = random.Random(12)
    for r in range(args.rounds):
        for name in rng.sample(list(jobs), len(jobs)):
            shutil.rmtree(out, ignore_errors=True)
            times[name].append(jobs[name]())
            out_bytes[name] = dir_bytes(out)
        print(f"round {r} done", file=sys.stderr, flush=True)
    shutil.rmtree(root)
    base = statistics.median(times["cp -r + fsync"])
    print(f"{'job':40} {'median s':>9} {'best s':>8} {'copy time / time':>17} {'out GB':>7}")
    for name, t in times.items():
        m = statistics.median(t)
        print(f"{name:40} {m:9.3f} {min(t):8.3f} {base / m:17.2f} {out_bytes[name] / 1e9:7.2f}")
    m = statistics.median(times["convert --layout single --dtype bf16"])
    print(f"dequantizing: {total / 1e9 / m:.2f} GB/s in, "
          f"{out_bytes['convert --layout single --dtype bf16'] / 1e9 / m:.2f} GB/s out; "
          f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
