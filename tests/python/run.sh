#!/usr/bin/env bash
# The Python package as a user gets it: a wheel built from this checkout by `pip wheel .`
# (scikit-build-core; OpenBLAS left out, so that the build without it is the one tested),
# installed into a fresh virtual environment that sees Debian's NumPy, PyTorch 1.13 and pytest,
# with the test peers (safetensors, ml_dtypes) from PyPI; then its pytest suite.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT

/usr/bin/python3 -m venv --system-site-packages "$d/venv"
py="$d/venv/bin/python"
numpy=$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')
"$py" -m pip install -q --disable-pip-version-check "safetensors==0.6.2" "ml_dtypes==0.5.1" \
  "numpy==$numpy"

wheel=$(bash scripts/wheel.sh | tail -1)
"$py" -m pip install -q --disable-pip-version-check --no-deps "$wheel"

# From outside the checkout, so that `import grouplin` is the installed package.
cd "$d"
GROUPLIN_PACKAGE_WITHOUT_OPENBLAS=1 "$py" -m pytest -q -p no:cacheprovider "$root/tests/python"
