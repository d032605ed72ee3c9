#!/usr/bin/env bash
# GroupLin against the real writers and readers: the pinned PyTorch 2.x, transformers and
# safetensors of scripts/peer-env.sh (created once per machine, outside the clone) run
# tests/peers/test_*.py (unittest) against the grouplin command of the release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$(bash scripts/peer-env.sh | tail -1)
export GROUPLIN_CLI="$PWD/${BUILD:-build}/grouplin"
"$py" -m unittest discover -s tests/peers -p 'test_*.py' -t tests/peers
