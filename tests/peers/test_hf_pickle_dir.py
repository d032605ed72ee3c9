"""A Hugging Face model directory saved whole as one pickle: `pytorch_model.bin` without an index,
as transformers 4's save_pretrained(safe_serialization=False) wrote it (torch.save of the state
dict). GroupLin reads it as a directory, converts it, and transformers loads the result."""
import os
import shutil

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, MixtralConfig

from peers import ScratchTest, grouplin


class PickleDirectory(ScratchTest):
    def test_pytorch_model_bin_directory_converts_and_loads(self):
        config = MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=8,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=16)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(self.path("st"))
        hub = load_file(self.path("st/model.safetensors"))  # the Hub form, per-expert
        os.makedirs(self.path("bin"))
        torch.save(hub, self.path("bin/pytorch_model.bin"))
        shutil.copy(self.path("st/config.json"), self.path("bin/config.json"))

        r = grouplin("inspect", self.path("bin"))
        self.assertIn("shards: pytorch_model.bin", r.stdout)
        self.assertIn("block_sparse_moe.experts.", r.stdout)
        for layout in ("single", "per-expert"):
            with self.subTest(layout=layout):
                out = self.path(f"out-{layout}")
                grouplin("convert", self.path("bin"), out, "--layout", layout, "--format",
                         "safetensors")
                self.assertTrue(os.path.exists(os.path.join(out, "config.json")))
                want = dict(AutoModelForCausalLM.from_pretrained(self.path("st")).state_dict())
                got = dict(AutoModelForCausalLM.from_pretrained(out).state_dict())
                self.assertEqual(sorted(got), sorted(want))
                for name, t in want.items():
                    self.assertTrue(torch.equal(got[name], t), name)
