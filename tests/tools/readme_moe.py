"""Writes moe.pt, the checkpoint of the README's command-line walk-through, with torch.save:
two TransformerEngine-style grouped modules of 4 experts (weight{i} BF16 [8, 16], bias{i} BF16 [8]),
no _extra_state, and an embedding that is no expert.

    python3 tests/tools/readme_moe.py moe.pt
"""
import sys

import torch

torch.manual_seed(0)
sd = {}
for layer in range(2):
    prefix = f"model.layers.{layer}.mlp.experts."
    for i in range(4):
        sd[f"{prefix}weight{i}"] = torch.randn(8, 16).to(torch.bfloat16)
    for i in range(4):
        sd[f"{prefix}bias{i}"] = torch.randn(8).to(torch.bfloat16)
sd["model.embed_tokens.weight"] = torch.randn(32, 16)
torch.save(sd, sys.argv[1])
