"""Hugging Face-style sharded checkpoints from the reference `safetensors` package, as peers for
GroupLin's directory conversion.

    hf_shards_peer.py make ROOT
        writes, for each case of CASES (a family and whether there is an index), a per-expert MoE
        checkpoint into ROOT/<case>/hf: qwen names mlp.experts.E.{gate,up,down}_proj, mixtral
        block_sparse_moe.experts.E.{w1,w3,w2}; shards written by safetensors.torch.save_file,
        each expert's three tensors in three different shards; model.safetensors.index.json as
        transformers writes it (or none); config.json and a tokenizer file beside them
    hf_shards_peer.py check ROOT
        for each case, checks that ROOT/<case>/fused holds what transformers 5 holds after
        loading ROOT/<case>/hf: every expert module as gate_up_proj [N, 2I, H] (torch.stack over
        experts of torch.cat([gate, up])) and down_proj [N, H, I], ".block_sparse_moe." renamed
        ".mlp." for mixtral, every other tensor unchanged, bit for bit; that its index is the
        exact json.dumps(indent=2, sort_keys=True) of its shards' contents; that the reference
        re-serializes every shard to the same bytes; and that ROOT/<case>/back holds exactly the
        tensors of ROOT/<case>/hf (names, dtypes, shapes, bits)

Exit status 0 when everything agrees, 1 (differences on stderr) otherwise.
"""

import json
import os
import sys

import safetensors.torch
import torch
from safetensors import safe_open

LAYERS, EXPERTS, HIDDEN, INTER = 2, 4, 8, 6
SHARDS = 3
# (directory name, family, with an index)
CASES = [("qwen", "qwen", True), ("qwen-noindex", "qwen", False),
         ("mixtral", "mixtral", True), ("mixtral-noindex", "mixtral", False)]


def names(family):
    if family == "mixtral":
        return "block_sparse_moe", ("w1", "w3", "w2")
    return "mlp", ("gate_proj", "up_proj", "down_proj")


def make(out, family, index=True):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    moe, (gate, up, down) = names(family)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": rand(16, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        sd[p + "self_attn.q_proj.weight"] = rand(HIDDEN, HIDDEN)
        sd[p + f"{moe}.gate.weight"] = rand(EXPERTS, HIDDEN)
        for e in range(EXPERTS):
            x = f"{p}{moe}.experts.{e}."
            sd[x + f"{gate}.weight"] = rand(INTER, HIDDEN)
            sd[x + f"{up}.weight"] = rand(INTER, HIDDEN)
            sd[x + f"{down}.weight"] = rand(HIDDEN, INTER)
        sd[p + "post_attention_layernorm.weight"] = rand(HIDDEN)
    sd["lm_head.weight"] = rand(16, HIDDEN)

    shard_names = [f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors" for s in range(SHARDS)]
    parts = [{} for _ in range(SHARDS)]
    weight_map = {}
    for k, (key, t) in enumerate(sd.items()):
        parts[k % SHARDS][key] = t
        weight_map[key] = shard_names[k % SHARDS]
    for name, part in zip(shard_names, parts):
        safetensors.torch.save_file(part, os.path.join(out, name), metadata={"format": "pt"})
    if index:
        total = sum(t.numel() * t.element_size() for t in sd.values())
        write_index(os.path.join(out, "model.safetensors.index.json"), total, weight_map)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "mixtral" if family == "mixtral" else "qwen3_moe"}, f)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0"}')


def index_text(total, weight_map):
    # What transformers' save_pretrained writes.
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return json.dumps(index, indent=2, sort_keys=True) + "\n"


def write_index(path, total, weight_map):
    with open(path, "w") as f:
        f.write(index_text(total, weight_map))


def load_dir(path):
    """Every tensor of a directory (index or not) and where each is."""
    tensors, where = {}, {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in f.keys():
                if key in tensors:
                    raise SystemExit(f"{key} in two shards")
                tensors[key] = f.get_tensor(key)
                where[key] = name
    return tensors, where


def fuse(per_expert, family):
    """transformers 5's conversion of module lists into fused experts, in torch."""
    moe, (gate, up, down) = names(family)
    out = {}
    for layer in range(LAYERS):
        src = f"model.layers.{layer}.{moe}.experts."
        dst = f"model.layers.{layer}.mlp.experts."
        out[dst + "gate_up_proj"] = torch.stack(
            [torch.cat([per_expert[f"{src}{e}.{gate}.weight"], per_expert[f"{src}{e}.{up}.weight"]])
             for e in range(EXPERTS)])
        out[dst + "down_proj"] = torch.stack(
            [per_expert[f"{src}{e}.{down}.weight"] for e in range(EXPERTS)])
    for key, t in per_expert.items():
        if ".experts." in key:
            continue
        out[key.replace(".block_sparse_moe.", ".mlp.")] = t
    return out


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


def compare(got, want, errors, what):
    for key in sorted(set(got) | set(want)):
        if key not in got:
            errors.append(f"{what}: {key} missing")
        elif key not in want:
            errors.append(f"{what}: {key} unexpected")
        elif got[key].dtype != want[key].dtype or got[key].shape != want[key].shape:
            errors.append(f"{what}: {key}: {got[key].dtype} {list(got[key].shape)} vs "
                          f"{want[key].dtype} {list(want[key].shape)}")
        elif not torch.equal(bits(got[key]), bits(want[key])):
            errors.append(f"{what}: {key}: other values")


def check_fused(per_dir, fused_dir, family):
    errors = []
    per_expert, _ = load_dir(per_dir)
    fused, where = load_dir(fused_dir)
    compare(fused, fuse(per_expert, family), errors, "fused")
    total = sum(t.numel() * t.element_size() for t in fused.values())
    index_path = os.path.join(fused_dir, "model.safetensors.index.json")
    with open(index_path) as f:
        if f.read() != index_text(total, where):
            errors.append("the index is not json.dumps(indent=2, sort_keys=True) of the shards")
    for name in set(where.values()):
        path = os.path.join(fused_dir, name)
        with safe_open(path, framework="pt") as f:
            meta = f.metadata()
            part = {k: f.get_tensor(k) for k in f.keys()}
        with open(path, "rb") as f:
            if safetensors.torch.save(part, metadata=meta) != f.read():
                errors.append(f"{name}: the reference writes other bytes for these tensors")
    return errors


def main(argv):
    if len(argv) != 2 or argv[0] not in ("make", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    errors = []
    for case, family, index in CASES:
        d = os.path.join(root, case)
        if argv[0] == "make":
            make(os.path.join(d, "hf"), family, index)
            continue
        hf = os.path.join(d, "hf")
        errors += [f"{case}: {e}" for e in check_fused(hf, os.path.join(d, "fused"), family)]
        back = []
        compare(load_dir(os.path.join(d, "back"))[0], load_dir(hf)[0], back, "back against hf")
        errors += [f"{case}: {e}" for e in back]
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
