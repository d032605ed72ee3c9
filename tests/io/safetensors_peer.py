"""The reference `safetensors` package as a test peer for GroupLin's reader and writer.

    safetensors_peer.py write DIR          writes reference files into DIR, and DIR/manifest.txt
    safetensors_peer.py check FILE MANIFEST  checks a GroupLin file against the manifest

Manifest lines (tab-separated, names and metadata hex-encoded UTF-8, data hex):
    tensor  FILE  NAME_HEX  DTYPE  DIMS(comma-separated, empty for 0-rank)  DATA_HEX
    meta    FILE  KEY_HEX   VALUE_HEX
    count   FILE  NUMBER_OF_TENSORS

`check` reads FILE with the reference in every way it offers (raw `deserialize`, `safe_open`,
`safetensors.numpy`, `safetensors.torch`), compares every tensor and the metadata with the
manifest, and re-serializes the tensors with the reference: the bytes must equal FILE exactly.
Exit status 0 when all agree, 1 (with the differences on stderr) otherwise.
"""

import os
import sys

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

# safetensors dtype -> (name the raw serialize() takes, numpy dtype or None, torch dtype or None)
DTYPES = {
    "BOOL": ("bool", np.bool_, torch.bool),
    "U8": ("uint8", np.uint8, torch.uint8),
    "I8": ("int8", np.int8, torch.int8),
    "F8_E5M2": ("float8_e5m2", ml_dtypes.float8_e5m2, None),
    "F8_E4M3": ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, None),
    "F8_E8M0": ("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, None),  # safetensors >= 0.6
    "I16": ("int16", np.int16, torch.int16),
    "U16": ("uint16", np.uint16, None),
    "F16": ("float16", np.float16, torch.float16),
    "BF16": ("bfloat16", ml_dtypes.bfloat16, torch.bfloat16),
    "I32": ("int32", np.int32, torch.int32),
    "U32": ("uint32", np.uint32, None),
    "F32": ("float32", np.float32, torch.float32),
    "F64": ("float64", np.float64, torch.float64),
    "I64": ("int64", np.int64, torch.int64),
    "U64": ("uint64", np.uint64, None),
}
# dtypes safetensors.numpy can load back (its loader only knows numpy's own types).
NUMPY_LOADABLE = {"BOOL", "U8", "I8", "I16", "U16", "F16", "I32", "U32", "F32", "F64", "I64", "U64"}


def pattern(nbytes, seed):
    return bytes((i * 7 + seed * 31 + 1) % 256 for i in range(nbytes))


def manifest_lines(file, tensors, metadata):
    """tensors: name -> (dtype, shape, data bytes)."""
    lines = [f"count\t{file}\t{len(tensors)}"]
    for name, (dtype, shape, data) in sorted(tensors.items()):
        dims = ",".join(str(d) for d in shape)
        lines.append(f"tensor\t{file}\t{name.encode().hex()}\t{dtype}\t{dims}\t{data.hex()}")
    for k, v in sorted((metadata or {}).items()):
        lines.append(f"meta\t{file}\t{k.encode().hex()}\t{v.encode().hex()}")
    return lines


def write_reference_files(out_dir):
    lines = []

    # 1. The raw API: every dtype this reference knows, odd shapes, odd names.
    tensors = {}
    shapes = [[3, 5], [], [0], [2, 0, 3]]
    seed = 0
    for dtype, (raw, np_dtype, _) in DTYPES.items():
        for shape in shapes:
            seed += 1
            n = int(np.prod(shape)) if shape else 1
            data = pattern(n * np.dtype(np_dtype).itemsize, seed)
            tensors[f"{dtype}.s{len(shape)}.{seed}"] = (dtype, shape, data)
    tensors["name with \"quotes\", \\ and \u00e9\n"] = ("U8", [2], b"\x01\x02")
    raw = {k: {"dtype": DTYPES[d][0], "shape": s, "data": b} for k, (d, s, b) in tensors.items()}
    meta = {"format": "raw"}
    safetensors.serialize_file(raw, os.path.join(out_dir, "raw.safetensors"), metadata=meta)
    lines += manifest_lines("raw.safetensors", tensors, meta)

    # 2. safetensors.numpy with numpy and ml_dtypes arrays (BF16 and F8 included).
    rng = np.random.default_rng(7)
    arrays = {}
    for dtype, (_, np_dtype, _) in DTYPES.items():
        if dtype == "BOOL":
            a = rng.integers(0, 2, size=(4, 3)).astype(np.bool_)
        elif np.issubdtype(np.dtype(np_dtype), np.integer):
            a = rng.integers(0, 100, size=(4, 3)).astype(np_dtype)
        else:
            a = (rng.standard_normal((4, 3)) * 10).astype(np.float32).astype(np_dtype)
        arrays[f"np.{dtype}"] = a
    arrays["np.scalar"] = np.array(3.5, dtype=np.float32)
    arrays["np.empty"] = np.zeros((0, 7), dtype=np.float32)
    safetensors.numpy.save_file(arrays, os.path.join(out_dir, "numpy.safetensors"))
    by_np = {np.dtype(v[1]): k for k, v in DTYPES.items()}
    tensors = {k: (by_np[a.dtype], list(a.shape), np.ascontiguousarray(a).tobytes())
               for k, a in arrays.items()}
    lines += manifest_lines("numpy.safetensors", tensors, None)

    # 3. safetensors.torch, as torch users write checkpoints.
    g = torch.Generator().manual_seed(11)
    ts = {
        "fc1.weight": torch.randn(8, 4, generator=g),
        "fc1.weight.bf16": torch.randn(8, 4, generator=g).to(torch.bfloat16),
        "fc1.weight.f16": torch.randn(8, 4, generator=g).to(torch.float16),
        "fc1.bias": torch.randn(8, generator=g).to(torch.float64),
        "steps": torch.tensor(12345, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "codes": torch.tensor([-3, 0, 7], dtype=torch.int8),
        "empty": torch.zeros(0, 3),
    }
    meta = {"format": "pt"}
    safetensors.torch.save_file(ts, os.path.join(out_dir, "torch.safetensors"), metadata=meta)
    by_torch = {v[2]: k for k, v in DTYPES.items() if v[2] is not None}
    tensors = {}
    for k, t in ts.items():
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        tensors[k] = (by_torch[t.dtype], list(t.shape), data)
    lines += manifest_lines("torch.safetensors", tensors, meta)

    with open(os.path.join(out_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def read_manifest(path):
    tensors, meta = {}, {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "tensor":
                _, _, name, dtype, dims, data = parts
                shape = [int(d) for d in dims.split(",")] if dims else []
                tensors[bytes.fromhex(name).decode()] = (dtype, shape, bytes.fromhex(data))
            elif parts[0] == "meta":
                meta[bytes.fromhex(parts[2]).decode()] = bytes.fromhex(parts[3]).decode()
    return tensors, meta


def check_file(path, manifest):
    want, want_meta = read_manifest(manifest)
    problems = []
    with open(path, "rb") as f:
        file_bytes = f.read()

    # Raw: every dtype, bytes as stored.
    got = {name: (t["dtype"], list(t["shape"]), bytes(t["data"]))
           for name, t in safetensors.deserialize(file_bytes)}
    if set(got) != set(want):
        problems.append(f"names differ: only in file {sorted(set(got) - set(want))}, "
                        f"only in manifest {sorted(set(want) - set(got))}")
    for name in sorted(set(got) & set(want)):
        if got[name] != want[name]:
            problems.append(f"tensor {name!r}: reference reads {got[name][:2]} "
                            f"{got[name][2][:16].hex()}..., expected {want[name][:2]} "
                            f"{want[name][2][:16].hex()}...")

    with safetensors.safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
        if meta != want_meta:
            problems.append(f"metadata: reference reads {meta}, expected {want_meta}")
        for name in f.keys():
            if want.get(name, ("",))[0] in NUMPY_LOADABLE:
                a = f.get_tensor(name)
                if a.tobytes() != want[name][2] or list(a.shape) != want[name][1]:
                    problems.append(f"tensor {name!r}: safe_open(numpy) reads other values")

    np_tensors = safetensors.numpy.load(file_bytes) if all(
        d in NUMPY_LOADABLE for d, _, _ in want.values()) else {}
    for name, a in np_tensors.items():
        if a.tobytes() != want[name][2]:
            problems.append(f"tensor {name!r}: safetensors.numpy reads other values")

    torch_dtypes = {k for k, v in DTYPES.items() if v[2] is not None}
    if all(d in torch_dtypes for d, _, _ in want.values()):
        for name, t in safetensors.torch.load(file_bytes).items():
            data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            if data != want[name][2] or list(t.shape) != want[name][1]:
                problems.append(f"tensor {name!r}: safetensors.torch reads other values")

    # The reference writes the very same bytes (metadata of one key keeps its order fixed).
    raw = {k: {"dtype": DTYPES[d][0], "shape": s, "data": b} for k, (d, s, b) in got.items()}
    again = safetensors.serialize(raw, metadata=want_meta or None)
    if len(want_meta) <= 1 and bytes(again) != file_bytes:
        problems.append(f"the reference writes other bytes for the same tensors "
                        f"({len(again)} vs {len(file_bytes)} bytes; headers "
                        f"{bytes(again)[8:200]!r} vs {file_bytes[8:200]!r})")

    for p in problems:
        print("MISMATCH:", p, file=sys.stderr)
    print(f"checked {len(got)} tensors of {path}: {len(problems)} problems")
    return 0 if not problems else 1


def main(argv):
    if len(argv) == 3 and argv[1] == "write":
        write_reference_files(argv[2])
        print("wrote reference files to", argv[2])
        return 0
    if len(argv) == 4 and argv[1] == "check":
        return check_file(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
