"""grouplin.transformers against transformers' own experts backends: every MoE family whose
experts class transformers decorates (the tiny models of bench/hf_zoo_families.py), its logits
and every parameter's gradient with experts_implementation="grouplin" against "eager" (F32), BF16
no further from eager than grouped_mm is, a few optimizer steps, and from_pretrained."""
import os
import subprocess
import sys
import unittest
import warnings

import torch

from peers import SOURCE, ScratchTest

sys.path.insert(0, os.path.join(SOURCE, "bench"))
import hf_zoo_families as zoo  # noqa: E402  (the families and their tiny configs)

import grouplin.transformers as gtf  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore")

# F32: GroupLin's sums run in another order than eager's (torch's matmul), so results differ by
# rounding only: logits within 1e-5 of the largest logit; gradients, whose rounding differences
# grow through every layer back to the embeddings, within 1e-4 of the largest gradient (measured:
# 1.2e-5 at most, gemma4_text).
F32_BOUND = 1e-5
GRAD_BOUND = 1e-4


def tiny_model(model_type, dtype=torch.float32):
    config = zoo.tiny_config(model_type)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return zoo.model_class(model_type).from_config(config).to(dtype)


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "_apply_gate")]


def run(model, implementation, ids):
    """Output and every parameter's gradient of a loss of it, with `implementation`."""
    model.set_experts_implementation(implementation)
    model.zero_grad()
    out = model(input_ids=ids)
    y = out.logits if hasattr(out, "logits") else out.last_hidden_state
    y.float().square().mean().backward()
    return y.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()
                                if p.grad is not None}


def relative(a, b):
    """max |a - b| relative to max |a|, over one tensor or over a dict of them together."""
    if isinstance(a, dict):
        scale = max(t.abs().max().item() for t in a.values())
        return max((a[n] - b[n]).abs().max().item() for n in a) / max(scale, 1e-30)
    return (a - b).abs().max().item() / max(a.abs().max().item(), 1e-30)


class Calls:
    """Counts the calls of the registered grouplin function."""

    def __enter__(self):
        self.count = 0

        def counted(*args, **kwargs):
            self.count += 1
            return gtf.experts_forward(*args, **kwargs)

        ExpertsInterface.register(gtf.NAME, counted)
        return self

    def __exit__(self, *exc):
        gtf.register()


class TransformersExperts(ScratchTest):
    def test_register_is_idempotent_and_names_the_backend(self):
        self.assertEqual(gtf.register(), "grouplin")
        self.assertEqual(gtf.register(), "grouplin")
        self.assertIs(ALL_EXPERTS_FUNCTIONS["grouplin"], gtf.experts_forward)

    def test_every_decorated_family_matches_eager(self):
        ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))
        checked, in_python = [], []
        for model_type in zoo.FAMILIES:
            model = tiny_model(model_type)
            modules = experts_modules(model)
            if not modules:  # transformers does not route this family's experts through the hook
                continue
            if gtf.gate_of(modules[0]) is None or modules[0].has_post_expert_norm:
                in_python.append(model_type)
            with self.subTest(model_type=model_type):
                eager, eager_grads = run(model, "eager", ids)
                with Calls() as calls:
                    ours, our_grads = run(model, "grouplin", ids)
                self.assertGreaterEqual(calls.count, 1, "the grouplin backend never ran")
                self.assertLess(relative(eager, ours), F32_BOUND)
                self.assertEqual(sorted(our_grads), sorted(eager_grads))
                self.assertLess(relative(eager_grads, our_grads), GRAD_BOUND)
                checked.append(model_type)
        self.assertGreaterEqual(len(checked), 50, checked)
        # Every family runs whole in C++ but those whose gate is a function of both halves
        # together (inkling2) or that norm each expert's output (muse_spark).
        print(f"\n{len(checked)} families; their gate in Python: {', '.join(in_python)}",
              file=sys.stderr)
        self.assertLessEqual(len(in_python), 4, in_python)

    def test_gates_are_recognised_by_what_they_compute(self):
        found = {}
        for model_type in ("qwen3_moe", "gpt_oss", "deepseek_v4", "gemma4_text", "nemotron_h",
                           "minimax_m3_vl_text"):
            found[model_type] = gtf.gate_of(experts_modules(tiny_model(model_type))[0])
        self.assertEqual(found["qwen3_moe"], ("multiply", "silu", False, None, 1.702))
        experts = experts_modules(tiny_model("gpt_oss"))[0]
        self.assertEqual(found["gpt_oss"],
                         ("glu_plus_one", "silu", True, experts.limit, experts.alpha))
        self.assertEqual(found["deepseek_v4"][:3], ("clamp_before", "silu", False))
        self.assertEqual(found["gemma4_text"][:2], ("multiply", "gelu_tanh"))
        self.assertEqual(found["nemotron_h"][:2], ("none", "relu2"))
        self.assertEqual(found["minimax_m3_vl_text"][:3], ("glu_plus_one", "silu", False))

    def test_a_gate_grouplin_does_not_know_runs_as_the_module_defines_it(self):
        model = tiny_model("qwen3_moe")
        experts = experts_modules(model)[0]
        width = experts.gate_up_proj.shape[1] // 2
        # One module's own gate, unlike any of GroupLin's: the grouped_mm backend calls it too.
        experts._apply_gate = lambda h: torch.tanh(h[..., :width]) * h[..., width:] + 0.25
        self.assertIsNone(gtf.gate_of(experts))
        self.assertIsNotNone(gtf.gate_of(experts_modules(model)[1]))  # the others keep theirs
        ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(5))
        grouped, grouped_grads = run(model, "grouped_mm", ids)
        ours, our_grads = run(model, "grouplin", ids)
        self.assertLess(relative(grouped, ours), F32_BOUND)
        self.assertLess(relative(grouped_grads, our_grads), GRAD_BOUND)

    def test_bf16_is_no_further_from_eager_than_grouped_mm(self):
        ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(2))
        for model_type in ("qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3", "olmoe"):
            with self.subTest(model_type=model_type):
                model = tiny_model(model_type, torch.bfloat16)
                eager, _ = run(model, "eager", ids)
                grouped, _ = run(model, "grouped_mm", ids)
                ours, _ = run(model, "grouplin", ids)
                self.assertLessEqual(relative(eager, ours),
                                     max(2 * relative(eager, grouped), 1e-2))

    def test_training_steps_give_eager_losses(self):
        ids = torch.randint(3, 90, (2, 8), generator=torch.Generator().manual_seed(3))
        for model_type in ("qwen3_moe", "gpt_oss"):
            losses = {}
            for implementation in ("eager", "grouplin"):
                model = tiny_model(model_type)
                model.set_experts_implementation(implementation)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
                losses[implementation] = []
                for _ in range(3):
                    optimizer.zero_grad()
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    optimizer.step()
                    losses[implementation].append(loss.item())
            with self.subTest(model_type=model_type):
                for a, b in zip(losses["eager"], losses["grouplin"]):
                    self.assertAlmostEqual(a, b, delta=1e-4 * abs(a))

    def test_from_pretrained_with_the_backend(self):
        model = tiny_model("qwen3_moe")
        model.save_pretrained(self.path("qwen3"))
        loaded = AutoModelForCausalLM.from_pretrained(self.path("qwen3"),
                                                      experts_implementation="grouplin")
        self.assertEqual(loaded.config._experts_implementation, "grouplin")
        ids = torch.randint(3, 90, (1, 6))
        with Calls() as calls, torch.no_grad():
            ours = loaded(input_ids=ids).logits
        self.assertEqual(calls.count, len(experts_modules(loaded)))
        loaded.set_experts_implementation("eager")
        with torch.no_grad():
            eager = loaded(input_ids=ids).logits
        self.assertLess(relative(eager, ours), F32_BOUND)

    def test_expert_parallel_sentinels_give_zero_rows(self):
        # An expert-parallel rank sees ids >= num_experts for experts it does not hold.
        model = tiny_model("qwen3_moe")
        experts = experts_modules(model)[0]
        g = torch.Generator().manual_seed(4)
        hidden = torch.randn(5, experts.gate_up_proj.shape[2], generator=g)
        index = torch.randint(0, experts.num_experts, (5, 2), generator=g)
        weights = torch.rand(5, 2, generator=g)
        sentinel = index.clone()
        sentinel[:, 1] = experts.num_experts  # every second slot held elsewhere
        sentinel[2, 0] = experts.num_experts + 3
        with torch.no_grad():
            got = gtf.experts_forward(experts, hidden, sentinel, weights)
            kept = weights.clone()
            kept[:, 1] = 0
            kept[2, 0] = 0
            want = gtf.experts_forward(experts, hidden, index, kept)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        self.assertTrue(torch.equal(got[2], torch.zeros_like(got[2])))

    def test_the_example_runs_and_agrees_with_eager(self):
        example = os.path.join(SOURCE, "examples", "python", "transformers_moe.py")
        r = subprocess.run([sys.executable, example], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("GroupLin and eager agree", r.stdout)

    def test_a_cuda_tensor_is_refused_naming_the_module(self):
        model = tiny_model("qwen3_moe")
        experts = experts_modules(model)[0]
        hidden = torch.zeros(2, 32, device="meta")
        index = torch.zeros(2, 2, dtype=torch.long, device="meta")
        with self.assertRaisesRegex(RuntimeError, "Qwen3MoeExperts.*meta"):
            gtf.experts_forward(experts, hidden, index, torch.zeros(2, 2, device="meta"))


if __name__ == "__main__":
    unittest.main()
