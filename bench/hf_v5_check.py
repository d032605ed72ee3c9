#!/usr/bin/env python3
"""bench/hf_v5_check.py: GroupLin's Hugging Face layout rules against transformers v5 itself.

For each model family (Qwen3-MoE: gate/up/down under mlp.experts; Mixtral: w1/w3/w2 under
block_sparse_moe, renamed by v5), builds a tiny random model with transformers v5, saves it in
the original per-expert format, and checks, name by name and bit for bit:

  1. `grouplin convert per-expert -> single` equals what transformers v5 holds after loading the
     per-expert checkpoint (model.state_dict(): fused gate_up_proj [N, 2I, H], down_proj);
  2. `grouplin convert single -> per-expert` of v5's own fused save equals v5's per-expert save
     (save_pretrained in the original format);
  3. the same for sharded directories (save_pretrained with a small max_shard_size: shards and an
     index), directory to directory, config.json's model_type choosing the rules: GroupLin's
     fused directory holds what v5 holds, GroupLin's per-expert directory what v5 saves, and its
     index's weight_map names every tensor with an exact total_size.

Needs the bench-only environment (PyTorch 2.x and transformers v5 from PyPI), which `make test`
never downloads:

  python3 bench/hf_v5_check.py            # creates .bench-venv on first use (large download)
  python3 bench/hf_v5_check.py --grouplin build/grouplin

Exit 0 when every tensor matches, 1 otherwise (the differences are printed).
"""

import argparse
import os
import subprocess
import sys
import tempfile

from bench_env import have_transformers_v5, reexec_in_bench_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(family):
    from transformers import MixtralConfig, Qwen3MoeConfig

    common = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    if family == "mixtral":
        return MixtralConfig(intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                             **common)
    return Qwen3MoeConfig(intermediate_size=48, moe_intermediate_size=16, num_experts=4,
                          num_experts_per_tok=2, decoder_sparse_step=1, head_dim=8, **common)


def safetensors_file(directory):
    names = [n for n in os.listdir(directory) if n.endswith(".safetensors")]
    if len(names) != 1:
        sys.exit(f"hf_v5_check: expected one safetensors file in {directory}, found {names}")
    return os.path.join(directory, names[0])


def load(path):
    """Every tensor of a safetensors file, or of every shard of a directory."""
    from safetensors.torch import load_file

    if not os.path.isdir(path):
        return load_file(path)
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


def check_index(directory):
    """The index of a sharded directory names each tensor's shard and the exact total size."""
    import json

    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    from safetensors import safe_open

    where, total = {}, 0
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="pt") as f:
                for k in f.keys():
                    where[k] = name
                    t = f.get_tensor(k)
                    total += t.numel() * t.element_size()
    ok = index["weight_map"] == where and index["metadata"]["total_size"] == total
    print(f"  index of {os.path.basename(directory)}: {len(where)} tensors, "
          f"{'exact' if ok else 'WRONG'}")
    return ok


def compare(what, got, want):
    import torch

    problems = []
    for name in sorted(set(got) | set(want)):
        if name not in got:
            problems.append(f"{name}: only in {what}'s reference")
        elif name not in want:
            problems.append(f"{name}: only in GroupLin's output")
        else:
            a, b = got[name], want[name]
            if a.dtype != b.dtype or a.shape != b.shape:
                problems.append(f"{name}: {a.dtype} {list(a.shape)} vs {b.dtype} {list(b.shape)}")
            elif not torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                 b.contiguous().reshape(-1).view(torch.uint8)):
                problems.append(f"{name}: different values")
    status = "same" if not problems else f"{len(problems)} differences"
    print(f"  {what}: {len(want)} reference tensors, {status}")
    for p in problems[:20]:
        print(f"    {p}")
    return not problems


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hf_v5_check: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")


def main():
    reexec_in_bench_env("hf_v5_check", have_transformers_v5)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grouplin", default=os.path.join(ROOT, "build", "grouplin"))
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("qwen3_moe", "mixtral"):
            print(f"{family}:")
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.bfloat16)
            orig = os.path.join(tmp, family + "-orig")
            fused = os.path.join(tmp, family + "-fused")
            model.save_pretrained(orig, save_original_format=True)
            model.save_pretrained(fused, save_original_format=False)
            # What v5 holds after loading the per-expert checkpoint.
            held = {k: v.detach().contiguous()
                    for k, v in AutoModelForCausalLM.from_pretrained(orig, dtype=torch.bfloat16)
                    .state_dict().items()}
            ours = os.path.join(tmp, family + "-grouplin-single.safetensors")
            run([args.grouplin, "convert", safetensors_file(orig), ours, "--layout", "single",
                 "--quiet"])
            ok &= compare("per-expert -> single vs v5's loaded model", load(ours), held)
            back = os.path.join(tmp, family + "-grouplin-per-expert.safetensors")
            rules = "hf-mixtral" if family == "mixtral" else "hf"
            run([args.grouplin, "convert", safetensors_file(fused), back, "--layout",
                 "per-expert", "--rules", rules, "--quiet"])
            ok &= compare("single -> per-expert vs v5's original-format save", load(back),
                          load(safetensors_file(orig)))
            with open(back, "rb") as a, open(safetensors_file(orig), "rb") as b:
                same_file = a.read() == b.read()
            print(f"  the per-expert file itself: {'byte-identical' if same_file else 'differs'}"
                  " to v5's (informational: header layout and metadata may differ)")
            # Sharded: v5's own sharded saves, directory to directory.
            orig_dir = os.path.join(tmp, family + "-orig-sharded")
            fused_dir = os.path.join(tmp, family + "-fused-sharded")
            model.save_pretrained(orig_dir, save_original_format=True, max_shard_size="20KB")
            model.save_pretrained(fused_dir, save_original_format=False, max_shard_size="20KB")
            shards = len([n for n in os.listdir(orig_dir) if n.endswith(".safetensors")])
            print(f"  sharded: v5 wrote {shards} shards")
            ours_dir = os.path.join(tmp, family + "-grouplin-fused-dir")
            run([args.grouplin, "convert", orig_dir, ours_dir, "--layout", "single",
                 "--max-shard-size", "20KB", "--quiet"])
            ok &= compare("sharded per-expert -> single vs v5's loaded model", load(ours_dir),
                          held)
            ok &= check_index(ours_dir)
            back_dir = os.path.join(tmp, family + "-grouplin-per-expert-dir")
            run([args.grouplin, "convert", fused_dir, back_dir, "--layout", "per-expert",
                 "--max-shard-size", "20KB", "--quiet"])  # config.json: the family's rules
            ok &= compare("sharded single -> per-expert vs v5's original-format save",
                          load(back_dir), load(orig_dir))
            ok &= check_index(back_dir)
            same = sorted(os.listdir(back_dir)) == sorted(os.listdir(orig_dir)) and all(
                open(os.path.join(back_dir, n), "rb").read() ==
                open(os.path.join(orig_dir, n), "rb").read() for n in os.listdir(orig_dir))
            print(f"  the per-expert directory itself: {'byte-identical' if same else 'differs'}"
                  " to v5's (informational: v5 deals tensors to shards in its module order,"
                  " GroupLin in natural key order)")
    print("all tensors match" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
