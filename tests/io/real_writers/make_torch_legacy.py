"""Writes a .pt file in torch.save's legacy format (before PyTorch 1.6's zip archive), with
Debian's PyTorch 1.13 and _use_new_zipfile_serialization=False: GroupLin does not read that format
and names it (tests/io/real_writers_test.cpp).

    /usr/bin/python3 tests/io/real_writers/make_torch_legacy.py
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
assert torch.__version__.startswith("1.13"), torch.__version__
path = os.path.join(HERE, "torch1_13_legacy.pt")
torch.save({"experts.weight0": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, path,
           _use_new_zipfile_serialization=False)
print(path, os.path.getsize(path), "bytes")
