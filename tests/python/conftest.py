"""Shared helpers of the Python package's tests (run by `make test` against the package
installed into a fresh virtual environment; see tests/python/run.sh)."""

import os
import sys
import threading

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The peers that write checkpoints with PyTorch's and safetensors' own code.
sys.path.insert(0, os.path.join(ROOT, "tests", "io"))


def mapped_ranges(path):
    """The address ranges this process maps from the file at `path` (/proc/self/maps)."""
    real = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(v, 16) for v in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def inside(address, nbytes, ranges):
    return any(lo <= address and address + nbytes <= hi for lo, hi in ranges)


def address_of(array):
    return array.__array_interface__["data"][0]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def cli():
    """The grouplin command installed with the package, beside the interpreter (GROUPLIN_CLI
    names another, for runs against a development build)."""
    path = os.environ.get("GROUPLIN_CLI") or os.path.join(os.path.dirname(sys.executable),
                                                          "grouplin")
    assert os.access(path, os.X_OK), f"the grouplin command was not installed with the package: {path}"
    return path


def te_checkpoint(rng, experts=4, out_features=6, in_features=5, dtype=np.float32, bias=True,
                  prefix="layers.0.experts."):
    """A TransformerEngine-style per-expert state dict (weight{i}, bias{i}) and a dense
    tensor beside it."""
    sd = {"embed.weight": rng.standard_normal((7, in_features)).astype(dtype)}
    for i in range(experts):
        sd[f"{prefix}weight{i}"] = rng.standard_normal((out_features, in_features)).astype(dtype)
        if bias:
            sd[f"{prefix}bias{i}"] = rng.standard_normal(out_features).astype(dtype)
    return sd


def run_on_threads(work, count):
    """work(k) for k < count, each on its own thread, all at once; returns what they raised."""
    errors = []

    def run(k):
        try:
            work(k)
        except Exception as e:  # noqa: BLE001 (returned to the test, which asserts on it)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
