"""A transformers MoE model whose experts run on GroupLin: a tiny Qwen3-MoE from a config (no
download), a few generated tokens, a few fine-tuning steps, each compared with transformers' own
eager experts.

    python examples/python/transformers_moe.py      # needs torch and transformers 5

Prints what it compared; exits non-zero when GroupLin and eager disagree.
"""
import sys

import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

import grouplin.transformers  # registers the experts backend "grouplin"


def tiny_qwen3_moe():
    config = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                            moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, num_experts=8,
                            num_experts_per_tok=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def generate(model, implementation, prompt):
    model.set_experts_implementation(implementation)
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=8, do_sample=False)[0].tolist()


def fine_tune(implementation, batch, steps=3):
    model = tiny_qwen3_moe()
    model.set_experts_implementation(implementation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    model = tiny_qwen3_moe()
    prompt = torch.tensor([[1, 17, 42, 99, 7]])
    ours, eager = generate(model, grouplin.transformers.NAME, prompt), generate(model, "eager", prompt)
    print("generated (grouplin):", ours)
    print("generated (eager):   ", eager)

    batch = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    our_losses, eager_losses = fine_tune("grouplin", batch), fine_tune("eager", batch)
    print("losses (grouplin):", [round(x, 6) for x in our_losses])
    print("losses (eager):   ", [round(x, 6) for x in eager_losses])

    same = ours == eager and all(abs(a - b) <= 1e-4 * abs(b)
                                 for a, b in zip(our_losses, eager_losses))
    print("GroupLin and eager agree" if same else "GroupLin and eager DISAGREE")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
