"""bench/transformers_model.py: a whole Qwen3-MoE model (a few full-width Qwen3-30B-A3B layers,
random weights, BF16) run by transformers 5 with its default experts backend and with GroupLin's
(grouplin.transformers), same run, interleaved rounds, best time kept: prefill of --prefill
tokens, and greedy decode tokens/s after a short prompt.

    PYTHONPATH=<grouplin package> .bench-venv/bin/python bench/transformers_model.py \\
        [--layers 4] [--prefill 512] [--decode 16] [--rounds 3] [--own-threads]

--own-threads adds "grouplin-own": GroupLin's experts on GroupLin's own threads instead of
torch's OpenMP threads (grouplin.torch.use_torch_threads(False) while it runs).
"""
import argparse
import time

import torch


def model(layers):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    config = Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                            num_experts=128, num_experts_per_tok=8, num_hidden_layers=layers,
                            num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                            vocab_size=151936, max_position_embeddings=4096)
    torch.manual_seed(0)
    m = Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--own-threads", action="store_true")
    args = ap.parse_args()
    import grouplin.torch
    import grouplin.transformers  # noqa: F401  (registers "grouplin")
    m = model(args.layers)
    default = m.config._experts_implementation
    backends = [default, "grouplin"] + (["grouplin-own"] if args.own_threads else [])
    print(f"# Qwen3-MoE, {args.layers} layers of Qwen3-30B-A3B width, BF16, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; default experts backend: "
          f"{default}")
    g = torch.Generator().manual_seed(1)
    prefill_ids = torch.randint(0, 151936, (1, args.prefill), generator=g)
    prompt_ids = torch.randint(0, 151936, (1, args.prompt), generator=g)
    best = {b: {"prefill": float("inf"), "decode": float("inf")} for b in backends}
    tokens = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        for b in backends:
            m.set_experts_implementation(b.split("-")[0])
            grouplin.torch.use_torch_threads(b != "grouplin-own")
            with torch.no_grad():
                t0 = time.perf_counter()
                m(input_ids=prefill_ids)
                prefill = time.perf_counter() - t0
                t0 = time.perf_counter()
                out = m.generate(prompt_ids, max_new_tokens=args.decode, min_new_tokens=args.decode,
                                 do_sample=False)
                decode = time.perf_counter() - t0
            tokens[b] = out[0, args.prompt:].tolist()
            if r:
                best[b]["prefill"] = min(best[b]["prefill"], prefill)
                best[b]["decode"] = min(best[b]["decode"], decode)
    same = tokens[default] == tokens["grouplin"]
    print("| | " + " | ".join(backends) + " | grouplin vs default |")
    print("|---|" + "---|" * len(backends) + "---|")
    p = [best[b]["prefill"] * 1e3 for b in backends]
    print(f"| prefill {args.prefill} tokens (ms) | " + " | ".join(f"{v:.0f}" for v in p) +
          f" | {p[0] / p[1]:.2f}x |")
    d = [args.decode / best[b]["decode"] for b in backends]
    print(f"| decode (tokens/s, {args.decode} after {args.prompt}) | " +
          " | ".join(f"{v:.2f}" for v in d) + f" | {d[1] / d[0]:.2f}x |")
    print(f"# greedy tokens the same for both backends: {same}")


if __name__ == "__main__":
    main()
