#!/usr/bin/env bash
# GroupLin against the real writers and readers: the pinned PyTorch 2.x, transformers and
# safetensors of scripts/peer-env.sh (created once per machine, outside the clone) run
# tests/peers/test_*.py (unittest) against the grouplin command of the release build and the
# Python package of this checkout (its wheel, scripts/wheel.sh, unpacked beside the environment:
# the cached environment itself is never changed).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$(bash scripts/peer-env.sh | tail -1)
wheel=$(bash scripts/wheel.sh | tail -1)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$py" -m pip install -q --disable-pip-version-check --no-deps --target "$d/site" "$wheel"
export GROUPLIN_CLI="$PWD/${BUILD:-build}/grouplin"
"$py" -c 'import torch, transformers, safetensors; print(f"test-peers: torch {torch.__version__}, transformers {transformers.__version__}, safetensors {safetensors.__version__}")'
PYTHONPATH="$d/site" "$py" -m unittest discover -s tests/peers -p 'test_*.py' -t tests/peers
