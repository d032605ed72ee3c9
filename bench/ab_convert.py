#!/usr/bin/env python3
"""Interleaved A/B of grouplin binaries on one conversion (two builds of different commits, say).

    python3 bench/ab_convert.py IN LAYOUT ROUNDS base=PATH other=PATH [more=PATH ...] [--opt VALUE]

Each round runs every binary's `grouplin convert IN OUT --layout LAYOUT` once, in a random order,
each after `sync` and into a fresh OUT beside IN's parent (build/ab-out); prints each binary's
median and best wall time and the ratio of its median to the first binary's.
"""
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

src, layout, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
# name=PATH: a binary; anything from the first "--" on goes to every `grouplin convert`.
rest = sys.argv[4:]
cut = next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))
bins = dict(a.split("=", 1) for a in rest[:cut])
extra = rest[cut:]
out = os.path.join(os.path.dirname(os.path.abspath(src.rstrip("/"))), "ab-out")
times = {k: [] for k in bins}
rng = random.Random(7)
for r in range(rounds):
    for name in rng.sample(list(bins), len(bins)):
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync"], check=True)
        start = time.perf_counter()
        subprocess.run([bins[name], "convert", src, out, "--layout", layout, "--quiet", *extra],
                       check=True)
        times[name].append(time.perf_counter() - start)
    print("round", r, "done", file=sys.stderr, flush=True)
shutil.rmtree(out, ignore_errors=True)
base = statistics.median(times[next(iter(bins))])
for name, t in times.items():
    print(f"{name}: median {statistics.median(t):.3f} s, best {min(t):.3f} s, "
          f"median / first's {statistics.median(t) / base:.3f}")
