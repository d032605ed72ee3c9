#!/usr/bin/env bash
# The Python package's wheel as users get it (`pip wheel .`, OpenBLAS left out), built with
# Debian's Python into ${BUILD:-build}/wheel/ and printed (its path, last line). A wheel already
# built from the same sources (tracked files as staged or changed, and untracked ones not
# ignored) is reused: test-python builds it, test-peers takes it.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${BUILD:-build}/wheel"
stamp=$({ git ls-files -s; git diff HEAD; git ls-files -o --exclude-standard -z |
          xargs -0 -r sha256sum; } | sha256sum | cut -d' ' -f1)
if [ -f "$out/.sources" ] && [ "$(cat "$out/.sources")" = "$stamp" ] &&
   ls "$out"/grouplin-*.whl >/dev/null 2>&1; then
  echo "wheel: the one built from these sources: $(basename "$out"/grouplin-*.whl)" >&2
  echo "$PWD/$(ls "$out"/grouplin-*.whl)"
  exit 0
fi
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
/usr/bin/python3 -m pip wheel -q --disable-pip-version-check --no-deps -w "$out" . \
  --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_OpenBLAS=ON \
  --config-settings=build-dir="$d/build" >&2
echo "$stamp" > "$out/.sources"
wheel=$(ls "$out"/grouplin-*.whl)
echo "wheel: built in $(($(date +%s) - start)) s: $(basename "$wheel")" >&2
echo "$PWD/$wheel"
