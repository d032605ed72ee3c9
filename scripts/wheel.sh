#!/usr/bin/env bash
# The Python package's wheel as users get it (`pip wheel .`, OpenBLAS left out), built with
# Debian's Python into ${BUILD:-build}/wheel/ and printed (its path, last line). The build folder
# (${BUILD:-build}/wheel-build) is kept, so that a second call (test-python, then test-peers)
# rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${BUILD:-build}/wheel"
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
/usr/bin/python3 -m pip wheel -q --disable-pip-version-check --no-deps -w "$out" . \
  --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_OpenBLAS=ON \
  --config-settings=build-dir="$PWD/${BUILD:-build}/wheel-build" >&2
wheel=$(ls "$out"/grouplin-*.whl)
echo "wheel: built in $(($(date +%s) - start)) s: $(basename "$wheel")" >&2
echo "$PWD/$wheel"
