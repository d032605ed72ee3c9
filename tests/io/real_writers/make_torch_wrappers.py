"""Writes the training checkpoints people have, with PyTorch's own torch.save (2.15 of
scripts/peer-env.sh): a state dict inside a wrapper, and plain values beside the tensors.

  torch2_15_training.pt   {"model": state dict, "iteration": 7, "optimizer": {"lr": 0.1}}
  torch2_15_lightning.pt  Lightning's layout: {"epoch": 3, "global_step": 10,
                          "pytorch-lightning_version": "2.4.0", "state_dict": state dict,
                          "optimizer_states": [Adam's state_dict()], "lr_schedulers": []}
  torch2_15_extra_none.pt a TransformerEngine module's state dict as older TE saved it:
                          "_extra_state" None beside the weights

The state dict: "experts.weight0".."experts.weight3" ([4, 6] F32, values k + 100 e) and
"experts.bias0".."experts.bias3" ([4] F32). tests/io/real_writers_test.cpp reads them.

    $(bash scripts/peer-env.sh | tail -1) tests/io/real_writers/make_torch_wrappers.py
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
assert torch.__version__.startswith("2.15"), torch.__version__

sd = {}
for e in range(4):
    sd[f"experts.weight{e}"] = torch.arange(24, dtype=torch.float32).reshape(4, 6) + 100 * e
for e in range(4):
    sd[f"experts.bias{e}"] = torch.full((4,), float(e))

params = [torch.nn.Parameter(sd["experts.weight0"].clone())]
adam = torch.optim.Adam(params, lr=0.1)
params[0].grad = torch.ones_like(params[0])
adam.step()

files = {
    "torch2_15_training.pt": {"model": sd, "iteration": 7, "optimizer": {"lr": 0.1}},
    "torch2_15_lightning.pt": {"epoch": 3, "global_step": 10, "pytorch-lightning_version": "2.4.0",
                               "state_dict": sd, "optimizer_states": [adam.state_dict()],
                               "lr_schedulers": []},
    "torch2_15_extra_none.pt": {**sd, "_extra_state": None},
}
for name, obj in files.items():
    torch.save(obj, os.path.join(HERE, name))
    print(name, os.path.getsize(os.path.join(HERE, name)), "bytes")
