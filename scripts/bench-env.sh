#!/usr/bin/env bash
# Creates .bench-venv: the benchmark- and comparison-only peers that `make test` never needs —
# PyTorch 2.x from PyPI (F.grouped_mm, oneDNN BF16) and transformers v5 (its fused-expert
# conversions) — beside the reference safetensors package and matplotlib (bench/gemm_sweep.py's
# plot). Safe to run again: it checks first.
# Used by bench/hf_v5_check.py; prints the environment's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.bench-venv
if [[ ! -x $venv/bin/python ]]; then
  echo "bench-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, transformers, safetensors, matplotlib; assert int(transformers.__version__.split(".")[0]) >= 5' 2>/dev/null; then
  echo "bench-env: installing torch, transformers>=5, safetensors into $venv (large download)" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch>=2.9" "transformers>=5" safetensors matplotlib >&2
fi
echo "$PWD/$venv/bin/python"
