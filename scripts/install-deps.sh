#!/usr/bin/env bash
# Installs what GroupLin needs to build and test, and nothing that is already there.
# Debian packages for the builds (with clang-format for the formatting check, the aarch64 cross
# compiler and qemu-user for the cross build, Open MPI for expert parallelism, jq for the README
# walk-through's test); a project-local Python environment (.venv) for the test peers (PyTorch
# from Debian, safetensors and ml_dtypes from PyPI). Safe to run again: it checks first.
set -euo pipefail
cd "$(dirname "$0")/.."

debian_packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev clang-format
  g++-aarch64-linux-gnu qemu-user
  libopenblas-dev nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev
  libsimde-dev libdeflate-dev
  libopenmpi-dev openmpi-bin
  python3-venv python3-dev python3-pytest python3-numpy python3-torch python3-packaging
  gnuplot-nox jq
)

missing=()
for p in "${debian_packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test peers. The venv sees Debian's numpy and torch (system site packages) so that PyTorch
# keeps the numpy it was built against; only the reference safetensors and ml_dtypes come from PyPI.
venv=.venv
if [[ ! -x $venv/bin/python ]]; then
  echo "install-deps: creating $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# ml_dtypes 0.5 and safetensors 0.6 are the first with F8_E8M0 (MX scales); both run on Debian's
# numpy 1.24.
peers_ok='import safetensors, safetensors.torch, ml_dtypes, torch, numpy
assert safetensors.__version__ == "0.6.2" and ml_dtypes.__version__ == "0.5.1"'
if ! "$venv/bin/python" -c "$peers_ok" 2>/dev/null; then
  echo "install-deps: installing Python test peers into $venv"
  # Pins keep numpy from being upgraded past what Debian's torch was built against.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "safetensors==0.6.2" "ml_dtypes==0.5.1" "numpy==$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')"
fi
