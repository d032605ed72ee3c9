"""An FP8 DeepSeek-V3 checkpoint as transformers saves it, dequantized by `grouplin convert --dtype`
and loaded back by transformers' `from_pretrained` as the values the codes and scales stand for;
and its experts run as FP8 by grouplin.transformers (use_fp8_experts, the FP8 experts interface).

transformers will not quantize on a CPU, so the test quantizes the saved experts itself, per
128 x 128 block as DeepSeek-V3's FP8 release does, and declares it in config.json the same way."""
import json
import os
import subprocess

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config

from peers import CLI, ScratchTest, grouplin

import grouplin.transformers as gtf  # noqa: E402
from transformers.integrations.finegrained_fp8 import (  # noqa: E402
    ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts)
from transformers.integrations.moe import use_experts_implementation  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

BLOCK = 128
EXPERTS = 4


def tiny_deepseek_v3(moe_intermediate_size):
    return DeepseekV3Config(
        vocab_size=64, hidden_size=256, intermediate_size=256,
        moe_intermediate_size=moe_intermediate_size, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=EXPERTS, num_experts_per_tok=2,
        n_shared_experts=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None,
        kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_group=1,
        topk_group=1, max_position_embeddings=64)


def quantize(w):
    """E4M3 codes and one F32 scale per 128 x 128 block (the last blocks partial)."""
    rows, cols = w.shape
    sr, sc = -(-rows // BLOCK), -(-cols // BLOCK)
    scales = torch.empty(sr, sc)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for a in range(sr):
        for b in range(sc):
            block = w[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK].float()
            scales[a, b] = block.abs().max().clamp(min=1e-12) / 448
            codes[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK] = (
                block / scales[a, b]).to(torch.float8_e4m3fn)
    return codes, scales


def dequantized(codes, scales, dtype):
    """PyTorch's `(q.float() * scale).to(dtype)` with each block's scale."""
    rows, cols = codes.shape
    full = scales.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return (codes.float() * full).to(dtype)


class Fp8Checkpoint(ScratchTest):
    """Makes the FP8 checkpoint (no tests of its own)."""

    def make_fp8(self, moe_intermediate_size):
        """The model saved by save_pretrained (BF16), and the same with FP8 experts; returns the
        expected values of every expert weight after dequantization to BF16."""
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_deepseek_v3(moe_intermediate_size))
        model.to(torch.bfloat16).save_pretrained(self.path("bf16"))
        saved = load_file(self.path("bf16/model.safetensors"))
        fp8, expected = {}, {}
        for name, t in saved.items():
            if ".mlp.experts." in name and name.endswith(".weight"):
                codes, scales = quantize(t)
                fp8[name], fp8[name + "_scale_inv"] = codes, scales
                expected[name] = dequantized(codes, scales, torch.bfloat16)
            else:
                fp8[name] = t
        self.assertTrue(expected, "the tiny model has no experts to quantize")
        os.makedirs(self.path("fp8"))
        save_file(fp8, self.path("fp8/model.safetensors"), metadata={"format": "pt"})
        with open(self.path("bf16/config.json")) as f:
            config = json.load(f)
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                         "activation_scheme": "dynamic",
                                         "weight_block_size": [BLOCK, BLOCK]}
        with open(self.path("fp8/config.json"), "w") as f:
            json.dump(config, f, indent=2)
        return saved, expected

    def fresh(self):
        """An empty scratch folder again."""
        self._tmp.cleanup()
        os.makedirs(self.dir)


class DeepseekV3Fp8(Fp8Checkpoint):
    def check_loaded(self, out, saved, expected):
        with open(os.path.join(out, "config.json")) as f:
            self.assertNotIn("quantization_config", json.load(f))
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
        params = dict(model.named_parameters())
        layer = "model.layers.1.mlp.experts."
        for e in range(EXPERTS):
            gate_up = params[layer + "gate_up_proj"][e]
            want = torch.cat([expected[f"{layer}{e}.gate_proj.weight"],
                              expected[f"{layer}{e}.up_proj.weight"]])
            self.assertTrue(torch.equal(gate_up, want), f"expert {e} gate_up_proj")
            self.assertTrue(torch.equal(params[layer + "down_proj"][e],
                                        expected[f"{layer}{e}.down_proj.weight"]),
                            f"expert {e} down_proj")
        for name, t in saved.items():  # every other weight as saved
            if ".mlp.experts." not in name and name in params:
                self.assertTrue(torch.equal(params[name], t), name)

    def test_dequantized_output_loads_as_its_values(self):
        for inter in (256, 200):  # blocks aligned with gate/up, and not (200 = 128 + 72)
            saved, expected = self.make_fp8(inter)
            for layout in ("per-expert", "single"):
                with self.subTest(moe_intermediate_size=inter, layout=layout):
                    out = self.path(f"out-{inter}-{layout}")
                    r = grouplin("convert", self.path("fp8"), out, "--dtype", "bf16",
                                 "--layout", layout)
                    self.assertIn("dequantized: ", r.stdout)
                    self.assertIn("edited: config.json: quantization_config", r.stdout)
                    self.check_loaded(out, saved, expected)
            self.fresh()

    def test_unaligned_scales_refused_without_dtype(self):
        self.make_fp8(200)
        r = subprocess.run([CLI, "convert", self.path("fp8"), self.path("out"), "--layout",
                            "single"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("ScaleBlocksUnaligned", r.stderr)
        self.assertFalse(os.path.exists(self.path("out")))


class Fp8ExpertsRun(Fp8Checkpoint):
    """The FP8 checkpoint's experts run as codes and scales by grouplin.transformers."""

    def load(self):
        """The model as saved in BF16. (from_pretrained of the FP8 folder would dequantize it
        on a CPU, as built here, but needs `accelerate`, which the pinned environment leaves
        out; its dequantized weights are `expected`, as the convert test above checks.)"""
        return AutoModelForCausalLM.from_pretrained(self.path("bf16"), dtype=torch.bfloat16,
                                                    experts_implementation="grouplin")

    def test_fp8_experts_match_the_dequantized_model(self):
        _, expected = self.make_fp8(256)
        ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(7))
        dequantized_model = self.load()
        layer = "model.layers.1.mlp.experts"
        params = dict(dequantized_model.named_parameters())
        with torch.no_grad():
            for e in range(EXPERTS):
                params[layer + ".gate_up_proj"][e] = torch.cat(
                    [expected[f"{layer}.{e}.gate_proj.weight"],
                     expected[f"{layer}.{e}.up_proj.weight"]])
                params[layer + ".down_proj"][e] = expected[f"{layer}.{e}.down_proj.weight"]
            want = dequantized_model(input_ids=ids).logits.float()
        model = self.load()
        self.assertEqual(gtf.use_fp8_experts(model, self.path("fp8")), 1)
        experts = dict(model.named_modules())["model.layers.1.mlp.experts"]
        self.assertEqual(experts.gate_up_proj.dtype, torch.float8_e4m3fn)
        self.assertEqual(experts.down_proj.dtype, torch.float8_e4m3fn)
        self.assertEqual(tuple(experts.gate_up_proj_scale_inv.shape), (EXPERTS, 4, 2))
        # No BF16 copy of an expert weight is kept: the experts hold codes and scales only.
        held = {n: t.dtype for n, t in experts.state_dict().items()}
        self.assertEqual(held, {"gate_up_proj": torch.float8_e4m3fn,
                                "down_proj": torch.float8_e4m3fn,
                                "gate_up_proj_scale_inv": torch.float32,
                                "down_proj_scale_inv": torch.float32})
        with torch.no_grad():
            got = model(input_ids=ids).logits.float()
        # The FP8 weights compute as their exact values; the dequantized model's are those values
        # rounded to BF16: the logits differ by that rounding only.
        scale = want.abs().max()
        self.assertLess(((got - want).abs().max() / scale).item(), 2e-2)
        self.assertGreater(torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1],
                           0.9999)

        # Gradients reach the hidden states through FP8 experts (the weights take none).
        hidden = torch.randn(5, 256, dtype=torch.bfloat16, requires_grad=True)
        index = torch.tensor([[0, 1], [2, 3], [1, 1], [3, 0], [2, 2]])
        routing = torch.rand(5, 2, dtype=torch.bfloat16)
        experts(hidden, index, routing).float().square().sum().backward()
        self.assertTrue(torch.isfinite(hidden.grad).all() and hidden.grad.abs().max() > 0)

        # transformers' own FP8 experts module reaches GroupLin through its FP8 interface.
        self.assertIs(ALL_FP8_EXPERTS_FUNCTIONS["grouplin"], gtf.experts_forward)
        cls = use_experts_implementation(experts_class=FP8Experts,
                                         experts_interface=ALL_FP8_EXPERTS_FUNCTIONS)
        config = model.config
        config._experts_implementation = "grouplin"
        fp8 = cls(config, block_size=(BLOCK, BLOCK))
        with torch.no_grad():
            for name in ("gate_up_proj", "down_proj"):
                getattr(fp8, name).copy_(getattr(experts, name))
                getattr(fp8, name + "_scale_inv").copy_(getattr(experts, name + "_scale_inv"))
            self.assertTrue(torch.equal(fp8(hidden, index, routing), experts(hidden, index, routing)))

    def test_a_checkpoint_without_fp8_experts_is_named(self):
        self.make_fp8(256)
        model = self.load()
        with self.assertRaisesRegex(ValueError, "model.layers.1.mlp.experts .*gate_proj.weight"):
            gtf.use_fp8_experts(model, self.path("bf16"))
        self.fresh()
        self.make_fp8(200)
        model = self.load()
        with self.assertRaisesRegex(ValueError, "200 rows, not a multiple of 128"):
            gtf.use_fp8_experts(model, self.path("fp8"))
