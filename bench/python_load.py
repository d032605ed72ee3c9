#!/usr/bin/env python3
"""bench/python_load.py: loading a checkpoint from Python, GroupLin's zero-copy mapping against
the reference readers, side by side in one process.

Writes a safetensors file and a torch.save .pt file of SIZE MiB (64 MiB tensors, F32), then times,
interleaved, best of REPS, each reader's load plus one read of every byte (a sum over each
tensor, so that a lazy load pays what it deferred):

  grouplin.load             read-only NumPy views of the mapping
  safetensors.numpy         safetensors.numpy.load_file (the reference package; copies)
  grouplin.torch.load (.pt) torch tensors over a copy-on-write mapping
  torch.load (.pt)          weights_only=True (Debian's PyTorch 1.13: reads into memory)

Runs with the package installed (tests/python/run.sh's way, or PYTHONPATH at a development
build) and the test peers of .venv:

  python bench/python_load.py [SIZE_MIB] [REPS]
"""

import os
import sys
import tempfile
import time

import numpy as np
import safetensors.numpy
import torch

import grouplin
import grouplin.torch


def timed(fn):
    start = time.perf_counter()
    total = fn()
    return time.perf_counter() - start, total


def main():
    size_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    count = max(1, size_mib // 64)
    rng = np.random.default_rng(0)
    tensors = {f"layers.{i}.weight": rng.standard_normal((4096, 4096)).astype(np.float32)
               for i in range(count)}
    with tempfile.TemporaryDirectory() as d:
        st, pt = os.path.join(d, "m.safetensors"), os.path.join(d, "m.pt")
        grouplin.save(st, tensors)
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, pt)
        del tensors
        readers = {
            "grouplin.load": lambda: sum(float(a.sum()) for a in grouplin.load(st).values()),
            "safetensors.numpy.load_file":
                lambda: sum(float(a.sum()) for a in safetensors.numpy.load_file(st).values()),
            "grouplin.torch.load (.pt)":
                lambda: sum(float(t.sum()) for t in grouplin.torch.load(pt).values()),
            "torch.load weights_only (.pt)":
                lambda: sum(float(t.sum())
                            for t in torch.load(pt, weights_only=True).values()),
        }
        best = {name: float("inf") for name in readers}
        sums = {}
        for _ in range(reps):
            for name, fn in readers.items():
                seconds, sums[name] = timed(fn)
                best[name] = min(best[name], seconds)
        assert len({round(s, 0) for s in sums.values()}) == 1, sums  # all read the same values
        gib = count * 64 / 1024
        print(f"{count * 64} MiB of F32 in {count} tensors, best of {reps}, page cache warm")
        # Each peer against GroupLin in the same framework (the sums are the frameworks' own).
        pairs = {"safetensors.numpy.load_file": "grouplin.load",
                 "torch.load weights_only (.pt)": "grouplin.torch.load (.pt)"}
        print("| reader | s | GiB/s | GroupLin's speedup |")
        print("|---|---|---|---|")
        for name, s in best.items():
            ours = pairs.get(name)
            ratio = f"{s / best[ours]:.2f}x ({ours})" if ours else "-"
            print(f"| {name} | {s:.3f} | {gib / s:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
