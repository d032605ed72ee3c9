"""bench/transformers_model.py: a whole Qwen3-MoE model (a few full-width Qwen3-30B-A3B layers,
random weights, BF16) run by transformers 5 with its default experts backend and with GroupLin's
(grouplin.transformers), same run, interleaved rounds, best time kept: prefill of --prefill
tokens as generate() runs it (logits of the last position only: generate passes
logits_to_keep=1), the same forward with the logits of every position (the vocabulary's
projection of all --prefill tokens, which generate never computes), and greedy decode tokens/s
after a short prompt.

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
    best = {b: {"prefill": float("inf"), "all_logits": float("inf"), "decode": float("inf")}
            for b in backends}
    tokens = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        for b in backends:
            m.set_experts_implementation(b.split("-")[0])
            grouplin.torch.use_torch_threads(b != "grouplin-own")
            with torch.no_grad():
                t0 = time.perf_counter()
                m(input_ids=prefill_ids, logits_to_keep=1)
                prefill = time.perf_counter() - t0
                t0 = time.perf_counter()
                m(input_ids=prefill_ids)
                all_logits = time.perf_counter() - t0
                t0 = time.perf_counter()
                out = m.generate(prompt_ids, max_new_tokens=args.decode, min_new_tokens=args.decode,
                                 do_sample=False)
                decode = time.perf_counter() - t0
            tokens[b] = out[0, args.prompt:].tolist()
            if r:
                best[b]["prefill"] = min(best[b]["prefill"], prefill)
                best[b]["all_logits"] = min(best[b]["all_logits"], all_logits)
                best[b]["decode"] = min(best[b]["decode"], decode)
    # The greedy tokens against transformers' reference loop ("eager", untimed): BF16 backends
    # that sum in different orders may part at a near tie of the random model's logits.
    m.set_experts_implementation("eager")
    with torch.no_grad():
        out = m.generate(prompt_ids, max_new_tokens=args.decode, min_new_tokens=args.decode,
                         do_sample=False)
    reference = out[0, args.prompt:].tolist()
    print("| | " + " | ".join(backends) + " | grouplin vs default |")
    print("|---|" + "---|" * len(backends) + "---|")
    for key, label in (("prefill", f"prefill {args.prefill} tokens (ms)"),
                       ("all_logits", f"forward of {args.prefill} tokens, every position's "
                                      "logits (ms)")):
        p = [best[b][key] * 1e3 for b in backends]
        print(f"| {label} | " + " | ".join(f"{v:.0f}" for v in p) + f" | {p[0] / p[1]:.2f}x |")
    d = [args.decode / best[b]["decode"] for b in backends]
    print(f"| decode (tokens/s, {args.decode} after {args.prompt}) | " +
          " | ".join(f"{v:.2f}" for v in d) + f" | {d[1] / d[0]:.2f}x |")
    for b in backends:
        apart = [i for i, (x, y) in enumerate(zip(tokens[b], reference)) if x != y]
        print(f"# {b}: {args.decode - len(apart)} of {args.decode} greedy tokens as eager's" +
              (f" (first apart at token {apart[0]})" if apart else ""))


if __name__ == "__main__":
    main()
