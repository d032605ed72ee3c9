"""bench/transformers_experts.py: one MoE experts layer of transformers 5 run by its experts
backends and by GroupLin's (grouplin.transformers), same run, interleaved rounds, best time kept.

    PYTHONPATH=<grouplin package> .bench-venv/bin/python bench/transformers_experts.py \\
        [--shape qwen3] [--tokens 1,8,64,512] [--backward 512] [--rounds 3]

Shapes (E experts, H hidden, I expert intermediate, top-k): qwen3 = Qwen3-30B-A3B (128, 2048,
768, 8), olmoe (64, 2048, 1024, 8), mixtral = Mixtral-8x7B (8, 4096, 14336, 2), gpt_oss =
gpt-oss-20b (32, 2880, 2880, 4; biases, clamped SwiGLU, weights stored transposed), deepseek =
a DeepSeek-V3 layer slice (16 of its experts, 7168, 2048, 8). BF16 weights, routing uniform at
random (seeded), routing weights softmaxed. Backend "grouplin-fp8" is GroupLin on the same
weights quantized to FP8 per 128 x 128 block (codes and scales in the module, as
grouplin.transformers.use_fp8_experts leaves them). A backend is timed only where one call takes
under --limit seconds (its first call decides). Prints a markdown table of milliseconds per call
and GroupLin's ratio to the best transformers backend; with --stream, a second table of the
weight bytes each forward must read and GroupLin's rate against a same-run streaming read of them
(torch summing them as int64 on its threads). Backend "grouplin-own" is GroupLin on its own
threads instead of torch's OpenMP threads (grouplin.torch.use_torch_threads(False) around each of
its calls); each round times every backend right after a torch op, as in a model.
"""
import argparse
import copy
import importlib
import time

import torch

# name: (model_type, E, H, I, top-k, the config's names for E and I)
SHAPES = {
    "qwen3": ("qwen3_moe", 128, 2048, 768, 8, "num_experts", "moe_intermediate_size"),
    "olmoe": ("olmoe", 64, 2048, 1024, 8, "num_experts", "intermediate_size"),
    "mixtral": ("mixtral", 8, 4096, 14336, 2, "num_local_experts", "intermediate_size"),
    "gpt_oss": ("gpt_oss", 32, 2880, 2880, 4, "num_local_experts", "intermediate_size"),
    "deepseek": ("deepseek_v3", 16, 7168, 2048, 8, "n_routed_experts", "moe_intermediate_size"),
}


def experts_class(model_type):
    """The experts class transformers decorates for this family."""
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    for name in dir(module):
        cls = getattr(module, name)
        if name.endswith("Experts") and isinstance(cls, type) and hasattr(cls, "_apply_gate"):
            return cls
    raise LookupError(f"no decorated experts class in {module.__name__}")


def experts_layer(shape):
    from transformers import AutoConfig
    model_type, e, h, i, k, e_name, i_name = SHAPES[shape]
    config = AutoConfig.for_model(model_type, hidden_size=h, num_experts_per_tok=k,
                                  **{e_name: e, i_name: i})
    torch.manual_seed(0)
    layer = experts_class(model_type)(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
    return layer, config, e, k


def fp8_copy(layer):
    """The layer with its weights as FP8 codes and F32 scales per 128 x 128 block (buffers)."""
    fp8 = copy.deepcopy(layer)
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(fp8, name).detach().float()
        experts, rows, cols = w.shape
        blocks = w.view(experts, rows // 128, 128, cols // 128, 128)
        scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / 448
        codes = (blocks / scale[:, :, None, :, None]).to(torch.float8_e4m3fn)
        delattr(fp8, name)
        fp8.register_buffer(name, codes.view(experts, rows, cols))
        fp8.register_buffer(name + "_scale_inv", scale.contiguous())
    return fp8


def inputs(config, e, k, tokens, grad):
    g = torch.Generator().manual_seed(tokens)
    h = torch.randn(tokens, config.hidden_size, generator=g).to(torch.bfloat16)
    h.requires_grad_(grad)
    index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1).to(torch.bfloat16)
    return h, index, weights


def stream_reader(layer, index, experts):
    """A function reading once, on torch's threads, the weight bytes a call with `index` must
    read (the experts it hits), and how many bytes that is: the same run's streaming rate."""
    hit = torch.unique(index[index < experts]).tolist()
    first = layer.gate_up_proj if layer.has_gate else layer.up_proj
    weights = [first.detach(), layer.down_proj.detach()]

    def read():
        for w in weights:
            if len(hit) == w.shape[0]:
                w.view(torch.int64).sum()
            else:
                for i in hit:
                    w[i].view(torch.int64).sum()

    return read, sum(w[0].numel() * w.element_size() for w in weights) * len(hit)


def call(layers, impl, h, index, weights, backward):
    import grouplin.torch
    layer = layers[impl]
    layer.config._experts_implementation = impl.split("-")[0]
    own = impl == "grouplin-own"
    if own:
        grouplin.torch.use_torch_threads(False)
    try:
        if backward:
            layer.zero_grad(set_to_none=True)
            out = layer(h, index, weights)
            out.float().sum().backward()
        else:
            with torch.no_grad():
                layer(h, index, weights)
    finally:
        if own:
            grouplin.torch.use_torch_threads(True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3", choices=SHAPES)
    ap.add_argument("--tokens", default="1,8,64,512")
    ap.add_argument("--backward", default="512", help="token counts timed with backward too")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--limit", type=float, default=10.0)
    ap.add_argument("--backends", default="eager,grouped_mm,grouplin")
    ap.add_argument("--stream", action="store_true",
                    help="also time a streaming read of the hit experts' weights (forward rows)")
    args = ap.parse_args()
    import grouplin.transformers  # noqa: F401  (registers "grouplin")
    layer, config, e, k = experts_layer(args.shape)
    backends = args.backends.split(",")
    if any(b.endswith("-fp8") for b in backends) and (
            layer.is_transposed or any(d % 128 for d in layer.gate_up_proj.shape[1:])):
        print(f"# {args.shape}: no FP8 backend (weights stored transposed, or not in whole "
              "128 x 128 blocks)")
        backends = [b for b in backends if not b.endswith("-fp8")]
    layers = {b: fp8_copy(layer) if b.endswith("-fp8") else layer for b in backends}
    fp8 = "grouplin-fp8" in backends
    cases = [(int(t), False) for t in args.tokens.split(",") if t]
    cases += [(int(t), True) for t in args.backward.split(",") if t]
    print(f"# {args.shape}: E {e}, H {config.hidden_size}, I {SHAPES[args.shape][3]}, "
          f"top-{k}, BF16, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| tokens | pass | " + " | ".join(backends) + " | grouplin vs best other |" +
          (" fp8 vs grouplin |" if fp8 else ""))
    print("|---|---|" + "---|" * len(backends) + "---|" + ("---|" if fp8 else ""))
    streams = []
    for tokens, backward in cases:
        h, index, weights = inputs(config, e, k, tokens, backward)
        best = {}
        for b in backends:  # first call: warm up, and drop what is too slow
            t0 = time.perf_counter()
            call(layers, b, h, index, weights, backward)
            if time.perf_counter() - t0 < args.limit:
                best[b] = float("inf")
        for _ in range(args.rounds):
            for b in list(best):
                torch.ones(256, 256) @ torch.ones(256, 256)  # a torch op before, as in a model
                t0 = time.perf_counter()
                call(layers, b, h, index, weights, backward)
                best[b] = min(best[b], time.perf_counter() - t0)
        if args.stream and not backward:
            read, nbytes = stream_reader(layer, index, e)
            read()
            t_read = float("inf")
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                read()
                t_read = min(t_read, time.perf_counter() - t0)
            # Each backend's own weight bytes (FP8: half of BF16's, the scales besides).
            rates = {b: stream_reader(layers[b], index, e)[1] / best[b] / 1e9 for b in best
                     if b.startswith("grouplin")}
            streams.append(f"| {tokens} | {nbytes / 1e6:.0f} | {t_read * 1e3:.1f} "
                           f"({nbytes / t_read / 1e9:.1f}) | " +
                           ", ".join(f"{b} {r:.1f} ({r / (nbytes / t_read / 1e9):.2f}x)"
                                     for b, r in rates.items()) + " |")
        cells = [f"{best[b] * 1e3:.1f}" if b in best else "—" for b in backends]
        others = [best[b] for b in best if not b.startswith("grouplin")]
        ratio = (f"{min(others) / best['grouplin']:.2f}x" if others and "grouplin" in best
                 else "—")
        if fp8:
            ratio += (f" | {best['grouplin'] / best['grouplin-fp8']:.2f}x"
                      if "grouplin" in best and "grouplin-fp8" in best else " | —")
        print(f"| {tokens} | {'fwd+bwd' if backward else 'fwd'} | " + " | ".join(cells) +
              f" | {ratio} |", flush=True)
    if streams:
        print("\n| tokens | weight MB read | streaming read ms (GB/s) | GroupLin GB/s (of the "
              "streaming rate) |")
        print("|---|---|---|---|")
        print("\n".join(streams))


if __name__ == "__main__":
    main()
