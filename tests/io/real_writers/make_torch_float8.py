"""Writes torch2_15_float8.pt with PyTorch's own torch.save (the real writer of .pt files).

PyTorch 2.x pickles the storage of a dtype without a typed storage class (float8, uint16, ...) as
torch.storage.UntypedStorage and rebuilds the tensor with torch._utils._rebuild_tensor_v3; a
reader that knows only what GroupLin's writer makes never sees that. The fixture is committed
(a few kB) so that reading it needs no PyTorch 2.x; tests/io/real_writers_test.cpp reads it.
Run with the pinned peer environment (scripts/peer-env.sh), which holds PyTorch 2.15.0:

    $(bash scripts/peer-env.sh | tail -1) tests/io/real_writers/make_torch_float8.py
"""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "torch2_15_float8.pt")
assert torch.__version__.startswith("2.15"), torch.__version__

codes = torch.arange(256, dtype=torch.uint8).reshape(16, 16)  # every code of every 8-bit format
stacked = codes.view(torch.float8_e4m3fn).reshape(2, 8, 16).clone()
sd = {
    # A TransformerEngine-named module of two FP8 experts, its scales beside it.
    "experts.weight0": stacked[0],  # views of one storage: torch saves it once
    "experts.weight1": stacked[1],
    "experts.weight0_scale_inv": torch.tensor([[0.5]], dtype=torch.float32),
    "experts.weight1_scale_inv": torch.tensor([[0.25]], dtype=torch.float32),
    "e5m2": codes[:4].view(torch.float8_e5m2).clone(),
    "e8m0": codes[0].view(torch.float8_e8m0fnu).clone(),
    "u16": torch.arange(6, dtype=torch.int32).to(torch.uint16).reshape(2, 3),
    "bf16": torch.arange(6, dtype=torch.float32).to(torch.bfloat16).reshape(2, 3),
}
torch.save(sd, out)
print(f"{out}: torch {torch.__version__}, {os.path.getsize(out)} bytes")
