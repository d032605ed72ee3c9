#!/usr/bin/env bash
# The pinned environment of the real readers and writers that `make test` checks GroupLin against:
# PyTorch 2.x (torch.save of float8 tensors, torch.load(weights_only=True)), transformers
# (save_pretrained, from_pretrained) and the reference safetensors package, from PyPI. About 5 GB
# (PyTorch's CUDA libraries come with it), so it lives outside the clone, keyed by the pins:
# a fresh clone on the same machine (CI's) reuses it, and changing a pin makes a new one.
# Safe to run again: it checks first. Prints the environment's python on its last line.
set -euo pipefail
pins=(torch==2.15.0 transformers==5.25.0 safetensors==0.8.0 numpy==2.4.6)
key=$(printf '%s\n' "${pins[@]}" | sha256sum | cut -c1-12)
root=${GROUPLIN_PEER_ENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/grouplin}
env_dir=$root/peers-$key
py=$env_dir/bin/python
check="import torch, transformers, safetensors
assert torch.__version__.split('+')[0] == '${pins[0]#torch==}', torch.__version__
assert transformers.__version__ == '${pins[1]#transformers==}', transformers.__version__"
if [[ -x $py ]] && "$py" -c "$check" 2>/dev/null; then
  echo "$py"
  exit 0
fi
mkdir -p "$root"
# Built beside its final place and renamed into it, so that an interrupted install is never
# taken for a finished one.
tmp=$(mktemp -d "$root/.peers-$key.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "peer-env: creating $env_dir (${pins[*]}; a large download, once per machine)" >&2
/usr/bin/python3 -m venv "$tmp"
"$tmp/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}" >&2
rm -rf "$env_dir"
mv "$tmp" "$env_dir"
trap - EXIT
"$py" -c "$check"
echo "$py"
