"""bench/transformers_experts.py: one MoE experts layer of transformers 5 run by its experts
backends and by GroupLin's (grouplin.transformers), same run, interleaved rounds, best time kept.

    PYTHONPATH=<grouplin package> .bench-venv/bin/python bench/transformers_experts.py \\
        [--shape qwen3] [--tokens 1,8,64,512] [--backward 512] [--rounds 3]

Shapes (E experts, H hidden, I expert intermediate, top-k): qwen3 = Qwen3-30B-A3B (128, 2048,
768, 8), olmoe (64, 2048, 1024, 8). BF16 weights, routing uniform at random (seeded), routing
weights softmaxed. A backend is timed only where one call takes under --limit seconds (its first
call decides). Prints a markdown table of milliseconds per call and GroupLin's ratio to the best
transformers backend.
"""
import argparse
import time

import torch

SHAPES = {"qwen3": ("qwen3_moe", 128, 2048, 768, 8), "olmoe": ("olmoe", 64, 2048, 1024, 8)}


def experts_layer(shape):
    from transformers import AutoConfig
    model_type, e, h, i, k = SHAPES[shape]
    kw = dict(hidden_size=h, moe_intermediate_size=i, intermediate_size=i, num_experts=e,
              num_experts_per_tok=k)
    config = AutoConfig.for_model(model_type, **kw)
    if model_type == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts as cls
    else:
        from transformers.models.olmoe.modeling_olmoe import OlmoeExperts as cls
    torch.manual_seed(0)
    layer = cls(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
    return layer, config, k


def inputs(config, k, tokens, grad):
    g = torch.Generator().manual_seed(tokens)
    h = torch.randn(tokens, config.hidden_size, generator=g).to(torch.bfloat16)
    h.requires_grad_(grad)
    e = config.num_experts
    index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1).to(torch.bfloat16)
    return h, index, weights


def call(layer, impl, h, index, weights, backward):
    layer.config._experts_implementation = impl
    if backward:
        layer.zero_grad(set_to_none=True)
        out = layer(h, index, weights)
        out.float().sum().backward()
    else:
        with torch.no_grad():
            layer(h, index, weights)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3", choices=SHAPES)
    ap.add_argument("--tokens", default="1,8,64,512")
    ap.add_argument("--backward", default="512", help="token counts timed with backward too")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--limit", type=float, default=10.0)
    ap.add_argument("--backends", default="eager,grouped_mm,grouplin")
    args = ap.parse_args()
    import grouplin.transformers  # noqa: F401  (registers "grouplin")
    layer, config, k = experts_layer(args.shape)
    backends = args.backends.split(",")
    cases = [(int(t), False) for t in args.tokens.split(",") if t]
    cases += [(int(t), True) for t in args.backward.split(",") if t]
    print(f"# {args.shape}: E {config.num_experts}, H {config.hidden_size}, "
          f"I {config.moe_intermediate_size}, top-{k}, BF16, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| tokens | pass | " + " | ".join(backends) + " | grouplin vs best other |")
    print("|---|---|" + "---|" * len(backends) + "---|")
    for tokens, backward in cases:
        h, index, weights = inputs(config, k, tokens, backward)
        best = {}
        for b in backends:  # first call: warm up, and drop what is too slow
            t0 = time.perf_counter()
            call(layer, b, h, index, weights, backward)
            if time.perf_counter() - t0 < args.limit:
                best[b] = float("inf")
        for _ in range(args.rounds):
            for b in list(best):
                t0 = time.perf_counter()
                call(layer, b, h, index, weights, backward)
                best[b] = min(best[b], time.perf_counter() - t0)
        cells = [f"{best[b] * 1e3:.1f}" if b in best else "—" for b in backends]
        others = [best[b] for b in best if b != "grouplin"]
        ratio = (f"{min(others) / best['grouplin']:.2f}x" if others and "grouplin" in best
                 else "—")
        print(f"| {tokens} | {'fwd+bwd' if backward else 'fwd'} | " + " | ".join(cells) +
              f" | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
