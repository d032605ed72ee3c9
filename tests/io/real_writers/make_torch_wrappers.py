"""Writes the training checkpoints people have, with PyTorch's own torch.save (2.15 of
scripts/peer-env.sh): a state dict inside a wrapper, and plain values beside the tensors.

  torch2_15_training.pt   {"model": state dict, "iteration": 7, "optimizer": {"lr": 0.1}}
  torch2_15_lightning.pt  Lightning's layout: {"epoch": 3, "global_step": 10,
                          "pytorch-lightning_version": "2.4.0", "state_dict": state dict,
                          "optimizer_states": [Adam's state_dict()], "lr_schedulers": []}
  torch2_15_extra_none.pt a TransformerEngine module's state dict as older TE saved it:
                          "_extra_state" None beside the weights
  torch2_15_extra_bytesio.pt  the state dict of a module whose get_extra_state is
                          TransformerEngine 0.12-1.13's: an io.BytesIO holding torch.save of its
                          FP8 metadata (a dict of tensors), as nn.Module.state_dict() gives it
  torch2_15_megatron.pt   Megatron-LM's model_optim_rng.pt: {"args": argparse.Namespace,
                          "checkpoint_version": 3.0, "iteration", "model": that state dict,
                          "optimizer", "opt_param_scheduler", "rng_state": [random, numpy and
                          torch RNG states], "num_floating_point_operations_so_far"}
  torch2_15_megatron_vp.pt  the same with two model chunks (virtual pipeline): "model0",
                          "model1" (model1's weights + 1000)

The state dict: "experts.weight0".."experts.weight3" ([4, 6] F32, values k + 100 e) and
"experts.bias0".."experts.bias3" ([4] F32). tests/io/real_writers_test.cpp reads them.

    $(bash scripts/peer-env.sh | tail -1) tests/io/real_writers/make_torch_wrappers.py
"""
import argparse
import io
import os
import random

import numpy as np
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



class Te1ExtraState(torch.nn.Module):
    """The experts' weights, and get_extra_state as TransformerEngine 0.12-1.13 wrote it
    (module/base.py: `state_serialized = io.BytesIO(); torch.save(state, state_serialized)`)."""

    def __init__(self, tensors):
        super().__init__()
        for name, t in tensors.items():
            self.register_parameter(name.split(".")[-1], torch.nn.Parameter(t.clone()))

    def get_extra_state(self):
        state = {"scale_fwd": torch.ones(3), "scale_inv_fwd": torch.ones(3),
                 "amax_history_fwd": torch.zeros(1024, 3),
                 "extra_fp8_variables": {"num_gemms": 4, "recipe": "DelayedScaling"}}
        state_serialized = io.BytesIO()
        torch.save(state, state_serialized)
        return state_serialized

    def set_extra_state(self, state):
        pass


te_model = torch.nn.Module()
te_model.experts = Te1ExtraState(sd)
te_sd = te_model.state_dict()
assert isinstance(te_sd["experts._extra_state"], io.BytesIO)
random.seed(1)
np.random.seed(1)
torch.manual_seed(1)
args = argparse.Namespace(num_layers=2, hidden_size=6, num_experts=4, moe_router_topk=2,
                          params_dtype=torch.bfloat16, fp8=None, seq_length=4096,
                          data_path=["corpus_text_document"], lr=3e-4, bf16=True)


def megatron(**models):
    return {"args": args, "checkpoint_version": 3.0, "iteration": 7, **models,
            "optimizer": {"optimizer": adam.state_dict(), "param_groups": []},
            "opt_param_scheduler": {"max_lr": 3e-4, "num_steps": 7},
            "rng_state": [{"random_rng_state": random.getstate(),
                           "np_rng_state": np.random.get_state(),
                           "torch_rng_state": torch.get_rng_state()}],
            "num_floating_point_operations_so_far": 0}


chunk1 = {k: (v + 1000 if isinstance(v, torch.Tensor) else v) for k, v in te_sd.items()}
files = {
    "torch2_15_training.pt": {"model": sd, "iteration": 7, "optimizer": {"lr": 0.1}},
    "torch2_15_lightning.pt": {"epoch": 3, "global_step": 10, "pytorch-lightning_version": "2.4.0",
                               "state_dict": sd, "optimizer_states": [adam.state_dict()],
                               "lr_schedulers": []},
    "torch2_15_extra_none.pt": {**sd, "_extra_state": None},
    "torch2_15_extra_bytesio.pt": te_sd,
    "torch2_15_megatron.pt": megatron(model=te_sd),
    "torch2_15_megatron_vp.pt": megatron(model0=te_sd, model1=chunk1),
}
for name, obj in files.items():
    torch.save(obj, os.path.join(HERE, name))
    print(name, os.path.getsize(os.path.join(HERE, name)), "bytes")
