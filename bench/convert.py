#!/usr/bin/env python3
"""bench/convert.py: checkpoint conversion throughput and memory, side by side with plain copies
and PyTorch, in one run.

Builds a synthetic MoE checkpoint (per-expert safetensors, default 1 GiB, 64 experts per layer)
and a Hugging Face-style sharded directory of the same size (Qwen-style module lists, every
expert's three projections in three different shards, an index, config.json), then times, in
interleaved rounds on the same filesystem:

  cp IN OUT                 and   cat IN > OUT          for each input file, then fsync(OUT)
  cp -r DIR OUT             and   cat of each file      for each input directory, then fsync
  grouplin convert          per-expert -> single and single -> per-expert, safetensors and .pt;
                            the directory: module lists -> fused experts and back, sharded
  PyTorch 1.13              load + torch.stack / unbind + save (safetensors.torch and torch.save)

(jobs in a new random order each round) and reports seconds (median of the rounds), GB/s, the
ratio to the faster plain copy of the same input file in the same run, and the peak RssAnon of
each process (anonymous resident memory: file pages the kernel can drop do not count), sampled
from /proc/PID/status every 2 ms by a thread of this script.

`grouplin convert` fsyncs OUT before renaming it into place (atomic and durable), so the fair
baseline is a plain copy followed by fsync(OUT); the plain copies' times without it are printed
too. Keep the files within the page cache (RAM > 5x the size) for warm-cache figures.

  .venv/bin/python bench/convert.py                      # 1 GiB, 7 rounds
  .venv/bin/python bench/convert.py --cases sharded --no-torch   # the directory cases only
  .venv/bin/python bench/convert.py --size-gib 4 --rounds 5 --no-torch --json out.json
Run it on a quiet machine (the load average is printed before and after).
"""

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_anon_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def measure(cmd, shell=False, env=None):
    """Runs cmd; returns (seconds, peak RssAnon in MiB) sampled every 2 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, shell=shell, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            # With shell=True the work happens in a child of the shell: sample the whole tree.
            pids = [proc.pid]
            try:
                with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                    pids += [int(p) for p in f.read().split()]
            except OSError:
                pass
            total = sum(v for v in (rss_anon_kib(p) for p in pids) if v is not None)
            peak[0] = max(peak[0], total)
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed ({proc.returncode}): {err.decode(errors='replace')}")
    return seconds, peak[0] / 1024


def fsync_file(path):
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


def make_checkpoint(path, size_gib, experts, out_features, in_features, bias):
    """Per-expert safetensors file written straight to disk (no tensor library, bounded memory),
    tensors in GroupLin's own order (by dtype size, then name) so it is what `grouplin convert`
    would write. BF16 expert weights [out, in]; optional F32 biases; an F32 norm per layer."""
    expert_bytes = out_features * in_features * 2
    layers = max(1, round(size_gib * (1 << 30) / (experts * expert_bytes)))
    entries = []  # (name, dtype, shape, nbytes)
    for l in range(layers):
        p = f"model.layers.{l}.mlp.experts."
        for i in range(experts):
            entries.append((f"{p}weight{i}", "BF16", [out_features, in_features], expert_bytes))
            if bias:
                entries.append((f"{p}bias{i}", "F32", [out_features], out_features * 4))
        entries.append((f"model.layers.{l}.input_layernorm.weight", "F32", [in_features],
                        in_features * 4))
    return layers, write_safetensors(path, entries)


def write_safetensors(path, entries, metadata=None, chunk=None):
    """A safetensors file of `entries` (name, dtype, shape, nbytes) with random bytes, in
    GroupLin's (and the reference's) order: by dtype size, then name."""
    size_rank = {"F32": 0, "BF16": 1, "F8_E4M3": 2}
    entries = sorted(entries, key=lambda e: (size_rank[e[1]], e[0]))
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    chunk = chunk or os.urandom(8 << 20)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        left = offset
        while left:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        # Clean pages, as a checkpoint that has been on disk a while: measured here, in-kernel
        # copies (cp, grouplin) of a file whose pages are still dirty or under writeback ran
        # 2-3x slower than of a clean one, while cat was not affected.
        f.flush()
        os.fsync(f.fileno())
    return offset


def make_hf_dir(path, size_gib, experts, hidden, inter, shards, fp8=False):
    """A Hugging Face MoE directory of Qwen-style module lists (BF16; with fp8, F8_E4M3 experts
    beside F32 weight_scale_inv per [128, 128] block, as DeepSeek-V3 and Qwen3-FP8), tensor k in
    shard k % shards so that every expert spans three shards; index and config.json as
    downloaded."""
    os.makedirs(path)
    esize = 1 if fp8 else 2
    expert_bytes = 3 * hidden * inter * esize
    layers = max(1, round(size_gib * (1 << 30) / (experts * expert_bytes)))
    entries = [("model.embed_tokens.weight", "BF16", [1024, hidden], 1024 * hidden * 2)]
    for l in range(layers):
        p = f"model.layers.{l}.mlp."
        entries.append((p + "gate.weight", "BF16", [experts, hidden], experts * hidden * 2))
        for e in range(experts):
            for name, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]),
                                ("down_proj", [hidden, inter])):
                k = f"{p}experts.{e}.{name}.weight"
                entries.append((k, "F8_E4M3" if fp8 else "BF16", shape, hidden * inter * esize))
                if fp8:
                    blocks = [(shape[0] + 127) // 128, (shape[1] + 127) // 128]
                    entries.append((k + "_scale_inv", "F32", blocks, blocks[0] * blocks[1] * 4))
        entries.append((f"model.layers.{l}.post_attention_layernorm.weight", "F32", [hidden],
                        hidden * 4))
    total = write_hf_shards(path, entries, shards,
                            {"model_type": "qwen3_moe", "num_experts": experts,
                             "hidden_size": hidden, "moe_intermediate_size": inter})
    return layers, total


def write_hf_shards(path, entries, shards, config):
    """`entries` (name, dtype, shape, nbytes) with random bytes in `shards` shards, entry k in
    shard k % shards, as Hugging Face names them, with an index and `config` as config.json.
    Returns the tensor bytes."""
    names = [f"model-{s + 1:05d}-of-{shards:05d}.safetensors" for s in range(shards)]
    parts = [[] for _ in range(shards)]
    weight_map = {}
    for k, e in enumerate(entries):
        parts[k % shards].append(e)
        weight_map[e[0]] = names[k % shards]
    chunk = os.urandom(8 << 20)
    total = sum(write_safetensors(os.path.join(path, n), part, {"format": "pt"}, chunk)
                for n, part in zip(names, parts))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                           indent=2, sort_keys=True) + "\n")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return total


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def fsync_tree(path):
    """fsync of every file of a directory (or the file), as grouplin does for each it writes."""
    if not os.path.isdir(path):
        return fsync_file(path)
    return sum(fsync_file(os.path.join(path, n)) for n in os.listdir(path))


TORCH_JOB = r"""
import sys, torch
from safetensors.torch import load_file, save_file
src, dst, to, fmt = sys.argv[1:5]
sd = load_file(src) if src.endswith(".safetensors") else torch.load(src, weights_only=True)
out, groups = {}, {}
for k, v in sd.items():
    head, _, leaf = k.rpartition(".")
    for base in ("weight", "bias"):
        if to == "single" and leaf.startswith(base) and leaf[len(base):].isdigit():
            groups.setdefault((head, base), {})[int(leaf[len(base):])] = v
            break
    else:
        if to == "per-expert" and leaf in ("weight", "bias") and k.endswith("experts." + leaf):
            for i, e in enumerate(v.unbind(0)):
                out[f"{head}.{leaf}{i}"] = e.clone()   # save_file refuses shared storages
        else:
            out[k] = v
for (head, base), parts in groups.items():
    out[f"{head}.{base}"] = torch.stack([parts[i] for i in range(len(parts))])
del sd
if fmt == "safetensors":
    save_file(out, dst)
else:
    torch.save(out, dst)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--out-features", type=int, default=1024)
    ap.add_argument("--in-features", type=int, default=2048)
    ap.add_argument("--no-bias", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-convert"),
                    help="scratch folder (all files on one filesystem)")
    ap.add_argument("--grouplin", default=os.path.join(ROOT, "build", "grouplin"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"),
                    help="Python with torch 1.13 and safetensors, for the PyTorch baseline")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--openblas-1", action="store_true",
                    help="also time grouplin with OPENBLAS_NUM_THREADS=1 (the CLI links OpenBLAS "
                         "for its bench command; OpenBLAS's idle worker thread spins a while "
                         "after start, taking a core from the copy)")
    ap.add_argument("--cases", choices=["files", "sharded", "all"], default="all",
                    help="single files, the sharded directory, or both (default)")
    ap.add_argument("--shards", type=int, default=4, help="shards of the sharded input")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=args.dir)
    load_before = open("/proc/loadavg").read().split()[:3]
    try:
        src = os.path.join(work, "per_expert.safetensors")
        layers, data = make_checkpoint(src, args.size_gib, args.experts, args.out_features,
                                       args.in_features, not args.no_bias)
        size = os.path.getsize(src)
        print(f"checkpoint: {size / 1e9:.2f} GB, {layers} layers x {args.experts} experts "
              f"[{args.out_features}, {args.in_features}] BF16, in {work}", flush=True)
        single = os.path.join(work, "single.safetensors")
        single_pt = os.path.join(work, "single.pt")
        per_expert_pt = os.path.join(work, "per_expert.pt")
        gl = args.grouplin
        envs = [("", None)]
        if args.openblas_1:
            envs.append((" [OPENBLAS_NUM_THREADS=1]", dict(os.environ, OPENBLAS_NUM_THREADS="1")))
        subprocess.run([gl, "convert", src, single, "--layout", "single", "--quiet"], check=True)
        subprocess.run([gl, "convert", src, per_expert_pt, "--layout", "per-expert", "--quiet"],
                       check=True)
        subprocess.run([gl, "convert", src, single_pt, "--layout", "single", "--quiet"],
                       check=True)
        out = os.path.join(work, "out")
        inputs = {"per-expert.safetensors": src, "single.safetensors": single,
                  "per-expert.pt": per_expert_pt, "single.pt": single_pt}

        # (name, run, input key or None, is a plain copy)
        cases = []
        for key, path in inputs.items():
            ext = os.path.splitext(path)[1]
            cases.append((f"cp {key}", lambda p=path, e=ext: measure(["cp", p, out + e]), key,
                          True))
            cases.append((f"cat {key}",
                          lambda p=path, e=ext: measure(f"cat '{p}' > '{out}{e}'", shell=True),
                          key, True))
        conversions = [
            ("per-expert -> single, safetensors", "per-expert.safetensors", "single",
             ".safetensors"),
            ("single -> per-expert, safetensors", "single.safetensors", "per-expert",
             ".safetensors"),
            ("per-expert -> single, safetensors -> .pt", "per-expert.safetensors", "single",
             ".pt"),
            ("single -> per-expert, .pt -> safetensors", "single.pt", "per-expert",
             ".safetensors"),
            ("per-expert -> single, .pt", "per-expert.pt", "single", ".pt"),
            ("single -> per-expert, .pt", "single.pt", "per-expert", ".pt"),
        ]
        for name, key, layout, ext in conversions:
            for suffix, env in envs:
                cases.append((f"grouplin {name}{suffix}",
                              lambda a=inputs[key], layout=layout, ext=ext, env=env: measure(
                                  [gl, "convert", a, out + ext, "--layout", layout, "--quiet"],
                                  env=env),
                              key, False))

        if args.cases == "sharded":
            cases = []
        sizes = {key: os.path.getsize(p) for key, p in inputs.items()}
        if args.cases != "files":
            # The same size in a Hugging Face layout (hidden 2048, expert size 768, as
            # Qwen3-30B-A3B), and its fused form as GroupLin writes it.
            hf = os.path.join(work, "hf")
            hf_layers, _ = make_hf_dir(hf, args.size_gib, args.experts, 2048, 768, args.shards)
            shard = str(-(-dir_bytes(hf) // args.shards)) + "B"  # as large as the input's shards
            fused = os.path.join(work, "fused")
            subprocess.run([gl, "convert", hf, fused, "--layout", "single", "--max-shard-size",
                            shard, "--quiet"], check=True)
            print(f"directory: {dir_bytes(hf) / 1e9:.2f} GB, {hf_layers} layers x "
                  f"{args.experts} experts, {args.shards} shards; fused: "
                  f"{len(os.listdir(fused))} files", flush=True)
            dirs = {"hf-dir": hf, "fused-dir": fused}
            for key, d in dirs.items():
                sizes[key] = dir_bytes(d)
                cases.append((f"cp -r {key}", lambda d=d: measure(["cp", "-r", d, out]), key, True))
                cases.append((f"cat {key}/*", lambda d=d: measure(
                    f"mkdir '{out}' && for f in '{d}'/*; do cat \"$f\" > '{out}'/\"${{f##*/}}\"; "
                    "done", shell=True), key, True))
            for name, key, layout in [("module lists -> fused, sharded directory", "hf-dir",
                                       "single"),
                                      ("fused -> module lists, sharded directory", "fused-dir",
                                       "per-expert")]:
                cases.append((f"grouplin {name}",
                              lambda a=dirs[key], layout=layout: measure(
                                  [gl, "convert", a, out, "--layout", layout, "--max-shard-size",
                                   shard, "--quiet"]),
                              key, False))

        results = {name: {"seconds": [], "fsync": [], "rss": [], "input": key, "plain": plain}
                   for name, _, key, plain in cases}
        rng = random.Random(1)
        for r in range(-1, args.rounds):  # round -1 warms the caches up and is not counted
            # A new order each round: what ran just before a job (a large delete, a fsync) was
            # seen to change its time by 2x on this machine.
            for name, run, _, plain in rng.sample(cases, len(cases)):
                for ext in (".safetensors", ".pt"):
                    if os.path.exists(out + ext):
                        os.remove(out + ext)
                shutil.rmtree(out, ignore_errors=True)
                # Each job starts on a quiet disk: the write-back of what the previous job left
                # (the deletion just done included) would otherwise be charged to this one.
                os.sync()
                seconds, rss = run()
                written = out
                if not os.path.isdir(out):
                    written = out + (".pt" if os.path.exists(out + ".pt") else ".safetensors")
                synced = fsync_tree(written) if plain else 0.0
                if r >= 0:
                    results[name]["seconds"].append(seconds)
                    results[name]["rss"].append(rss)
                    results[name]["fsync"].append(synced)
            print(f"round {r + 1}/{args.rounds} done", flush=True)

        if not args.no_torch and args.cases != "sharded":
            job = os.path.join(work, "torch_job.py")
            with open(job, "w") as f:
                f.write(TORCH_JOB)
            for name, key, layout, fmt, ext in [
                ("PyTorch per-expert -> single, safetensors", "per-expert.safetensors", "single",
                 "safetensors", ".safetensors"),
                ("PyTorch single -> per-expert, safetensors", "single.safetensors", "per-expert",
                 "safetensors", ".safetensors"),
                ("PyTorch per-expert -> single, .pt (torch.load/save)", "per-expert.pt",
                 "single", "pt", ".pt"),
                ("PyTorch single -> per-expert, .pt (torch.load/save)", "single.pt",
                 "per-expert", "pt", ".pt"),
            ]:
                for e in (".safetensors", ".pt"):
                    if os.path.exists(out + e):
                        os.remove(out + e)
                seconds, rss = measure([args.python, job, inputs[key], out + ext, layout, fmt])
                # torch does not fsync; add it so the figure is comparable.
                seconds += fsync_file(out + ext)
                results[name] = {"seconds": [seconds], "fsync": [0.0], "rss": [rss],
                                 "input": key, "plain": False}
                print(f"{name}: {seconds:.1f} s", flush=True)

        load_after = open("/proc/loadavg").read().split()[:3]
        med = {k: statistics.median(v["seconds"]) for k, v in results.items()}
        med_sync = {k: statistics.median([s + f for s, f in zip(v["seconds"], v["fsync"])])
                    for k, v in results.items()}
        low_sync = {k: min(s + f for s, f in zip(v["seconds"], v["fsync"]))
                    for k, v in results.items()}
        # The faster plain copy (+ fsync) of each input file, by median and by best round.
        keys = {v["input"] for v in results.values()}
        plain = {key: [k for k, v in results.items() if v["plain"] and v["input"] == key]
                 for key in keys}
        best = {key: min(med_sync[k] for k in plain[key]) for key in keys}
        best_low = {key: min(low_sync[k] for k in plain[key]) for key in keys}
        largest_tensor = args.experts * args.out_features * args.in_features * 2
        print(f"\nload average before {' '.join(load_before)}, after {' '.join(load_after)}")
        print(f"file {size / 1e9:.3f} GB; largest output tensor {largest_tensor / 2**20:.0f} MiB; "
              f"median of {args.rounds} rounds (PyTorch: 1 run); every time includes fsync(OUT)\n")
        print("| job | seconds | GB/s | vs faster plain copy of its input | best round: s, ratio "
              "| peak RssAnon MiB |")
        print("|---|---|---|---|---|---|")
        rows = []
        for name, v in results.items():
            t = med_sync[name]
            rss = max(v["rss"])
            ratio = best[v["input"]] / t
            low = low_sync[name]
            size = sizes[v["input"]]
            row = {"job": name, "input": v["input"], "seconds": t, "gb_per_s": size / t / 1e9,
                   "ratio_to_best_plain_copy": ratio, "best_round_seconds": low,
                   "best_round_ratio": best_low[v["input"]] / low, "peak_rss_anon_mib": rss,
                   "all_seconds": [a + b for a, b in zip(v["seconds"], v["fsync"])]}
            if v["plain"]:
                row["seconds_without_fsync"] = med[name]
            rows.append(row)
            print(f"| {name} | {t:.3f} | {size / t / 1e9:.2f} | {ratio:.2f}x | {low:.3f}, "
                  f"{best_low[v['input']] / low:.2f}x | {rss:.1f} |")
        print("\nwithout the fsync: " + ", ".join(
            f"{name} {med[name]:.3f} s" for name, v in results.items() if v["plain"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"file_bytes": os.path.getsize(src), "input_bytes": sizes,
                           "layers": layers, "experts": args.experts,
                           "largest_tensor_bytes": largest_tensor, "rounds": args.rounds,
                           "load_before": load_before, "load_after": load_after,
                           "rows": rows}, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
