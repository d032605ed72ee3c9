"""FP8 checkpoints for tests/io/fp8_interop_test.cpp, and the check of GroupLin's dequantized output.

Usage:
  fp8_peer.py make OUT_DIR            writes OUT_DIR/fp8.safetensors with the reference safetensors
  fp8_peer.py check IN OUT DTYPE LAYOUT
                                      OUT (GroupLin's `convert --dtype DTYPE --layout LAYOUT` of IN)
                                      must hold every FP8 weight of IN as
                                      (q.astype(f32) * scale).astype(DTYPE), bit for bit, no scales,
                                      every other entry byte for byte; experts stacked as
                                      transformers v5 and TransformerEngine do for LAYOUT single

The reference values use numpy's F32 multiply and ml_dtypes' rounding to BF16: the same single
IEEE multiply and round-to-nearest-even as PyTorch's `(q.float() * scale).to(dtype)`. The file
holds what real checkpoints hold:
  - Qwen3-FP8 / DeepSeek-V3 style experts: model.layers.0.mlp.experts.{E}.{gate,up,down}_proj
    .weight F8_E4M3 with .weight_scale_inv F32 per [128, 128] block (I = 256, H = 200: a ragged
    last block column);
  - a dense FP8 layer with its [128, 128] scales (self_attn.o_proj);
  - TransformerEngine-named MXFP8 experts: mlp.fc1.weight{i} F8_E4M3 [96, 64], weight{i}_scale_inv
    F8_E8M0 [96, 2] (one power-of-two scale per 32 values);
  - TE Float8Tensor-style experts: mlp.fc2.weight{i} F8_E5M2 with one F32 scale each ([1]);
  - entries that are not quantized (BF16 embeddings, an F32 norm, an I64 step).
"""

import json
import re
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import serialize_file

RAW = {
    np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn",
    np.dtype(ml_dtypes.float8_e5m2): "float8_e5m2",
    np.dtype(ml_dtypes.float8_e8m0fnu): "float8_e8m0fnu",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(np.float32): "float32",
    np.dtype(np.int64): "int64",
}
NUMPY = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
         "F8_E8M0": ml_dtypes.float8_e8m0fnu, "BF16": ml_dtypes.bfloat16, "F32": np.float32,
         "I64": np.int64}


def codes(rng, shape, dtype):
    """Random FP8 codes, NaN patterns included (they must stay NaN)."""
    return rng.integers(0, 256, size=shape, dtype=np.uint8).view(dtype)


def tensors(rng):
    t = {}
    e4m3, e5m2, e8m0 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu
    inter, hidden = 256, 200
    for e in range(3):
        p = f"model.layers.0.mlp.experts.{e}."
        for proj, (rows, cols) in [("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                   ("down_proj", (hidden, inter))]:
            t[p + proj + ".weight"] = codes(rng, (rows, cols), e4m3)
            t[p + proj + ".weight_scale_inv"] = rng.random(
                ((rows + 127) // 128, (cols + 127) // 128), dtype=np.float32) * 1e-2
    t["model.layers.0.self_attn.o_proj.weight"] = codes(rng, (hidden, hidden), e4m3)
    t["model.layers.0.self_attn.o_proj.weight_scale_inv"] = rng.random((2, 2), dtype=np.float32)
    for e in range(2):
        t[f"mlp.fc1.weight{e}"] = codes(rng, (96, 64), e4m3)
        t[f"mlp.fc1.weight{e}_scale_inv"] = rng.integers(100, 140, size=(96, 2),
                                                         dtype=np.uint8).view(e8m0)
        t[f"mlp.fc2.weight{e}"] = codes(rng, (64, 96), e5m2)
        t[f"mlp.fc2.weight{e}_scale_inv"] = np.array([rng.random() * 4], dtype=np.float32)
    t["model.embed_tokens.weight"] = rng.standard_normal((16, hidden)).astype(ml_dtypes.bfloat16)
    t["model.norm.weight"] = rng.standard_normal((hidden,)).astype(np.float32)
    t["step"] = np.array(7, dtype=np.int64)
    return t


def make(out_dir):
    t = tensors(np.random.default_rng(20261202))
    raw = {k: {"dtype": RAW[v.dtype], "shape": list(v.shape), "data": v.tobytes()}
           for k, v in t.items()}
    serialize_file(raw, str(Path(out_dir) / "fp8.safetensors"))


def read(path):
    """name -> numpy array (raw little-endian), parsed by hand: safetensors.numpy knows no FP8."""
    data = Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for k, h in header.items():
        b, e = h["data_offsets"]
        out[k] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=NUMPY[h["dtype"]]).reshape(h["shape"])
    return out


def expand(scale, rows, cols):
    """One scale per element: a [1]-shaped scale for the whole matrix, else its blocks."""
    if scale.size == 1:
        return np.full((rows, cols), scale.astype(np.float32).reshape(()), dtype=np.float32)
    br, bc = -(-rows // scale.shape[0]), -(-cols // scale.shape[1])
    if scale.shape == ((rows + 127) // 128, (cols + 127) // 128):
        br, bc = 128, 128
    elif scale.shape == (rows, (cols + 31) // 32):
        br, bc = 1, 32
    s = scale.astype(np.float32)
    return np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:rows, :cols]


def single_form(per_expert):
    """The stacked form: TE's P.weight{i} -> P.weight [N, ...]; module lists -> gate_up_proj
    (each expert's gate rows, then its up rows) and down_proj."""
    out, te, hf = {}, {}, {}
    for k, v in per_expert.items():
        if m := re.fullmatch(r"(.*experts\.)(\d+)\.(gate|up|down)_proj\.weight", k):
            hf.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = v
        elif m := re.fullmatch(r"(mlp\.fc\d\.)weight(\d+)", k):
            te.setdefault(m[1], {})[int(m[2])] = v
        else:
            out[k] = v
    for p, experts in te.items():
        out[p + "weight"] = np.stack([experts[i] for i in sorted(experts)])
    for p, experts in hf.items():
        ids = sorted(experts)
        out[p + "gate_up_proj"] = np.stack(
            [np.concatenate([experts[i]["gate"], experts[i]["up"]]) for i in ids])
        out[p + "down_proj"] = np.stack([experts[i]["down"] for i in ids])
    return out


def check(src_path, out_path, dtype, layout):
    target = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}[dtype]
    bits = {"f32": np.uint32, "bf16": np.uint16}[dtype]
    src, out = read(src_path), read(out_path)
    failures = []
    want = {}
    for k, v in src.items():
        if k.endswith("_scale_inv"):
            continue
        s = src.get(k + "_scale_inv")
        if v.dtype in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)):
            want[k] = (v.astype(np.float32) * expand(s, *v.shape)).astype(target)
        else:
            want[k] = v
    if layout == "single":
        want = single_form(want)
    if set(want) != set(out):
        failures.append(f"names differ: only in GroupLin's {sorted(set(out) - set(want))[:4]}, "
                        f"missing {sorted(set(want) - set(out))[:4]}")
    for k, w in want.items():
        g = out.get(k)
        if g is None:
            continue
        if g.dtype != w.dtype or g.shape != w.shape:
            failures.append(f"{k}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
            continue
        view = bits if w.dtype == np.dtype(target) else np.uint8
        differ = np.count_nonzero(np.frombuffer(g.tobytes(), view) != np.frombuffer(w.tobytes(), view))
        if differ:
            failures.append(f"{k}: {differ} of {w.size} values differ from numpy's")
    if failures:
        sys.exit("fp8_peer.py check: " + "; ".join(failures[:10]))
    print(f"fp8_peer.py: {len(want)} entries agree")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 6 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
