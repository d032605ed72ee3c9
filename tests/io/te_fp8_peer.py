"""TransformerEngine-style FP8 weights saved by PyTorch's own torch.save, for
tests/io/te_fp8_pickle_test.cpp and the .pt fuzz corpus.

Usage: te_fp8_peer.py OUT_DIR

Writes, each a state dict {"w": <Float8Tensor>, "b": <bf16 tensor>} (w's codes are 0x10 + k in
row-major order of its logical [3, 4] shape, its scale_inv 0.5):
  OUT_DIR/te_float8.pt            the reconstructor of TE >= 2.16 with its 5 arguments
                                  (..float8_tensor._make_float8_tensor_in_reduce_ex), TE's DType
                                  from transformer_engine.pytorch.constants
  OUT_DIR/te_float8_legacy.pt     Float8Tensor._make_in_reduce_ex, a static method, which protocol 2
                                  pickles as getattr(Float8Tensor, '_make_in_reduce_ex'), and the
                                  older transformer_engine_torch.DType
  OUT_DIR/te_float8_transpose.pt  only the transpose kept ([4, 3]), data None: the sixth argument
                                  of TE's main after 2.18
  OUT_DIR/te_float8_e5m2.pt       TE dtype 8 (float8 e5m2)
and {"w": <MXFP8Tensor>} of logical shape [130, 70] (codes (r * 70 + k) % 256, NaN patterns
0x7f/0xff replaced by 0x3f; E8M0 scales 20 + (r * 3 + c) % 200 for r < 130, c < 3, padded with
0xAA to TE's [256, 4]), with an MXFP8Quantizer (NEWOBJ + BUILD of its fields):
  OUT_DIR/te_mxfp8.pt             scales row-major, a column-wise copy beside (dropped on reading)
  OUT_DIR/te_mxfp8_swizzled.pt    scales in cuBLAS's 128 x 4 tiles (with_gemm_swizzled_scales)

TransformerEngine itself is not installed: stand-in modules under its names give the objects the
same __reduce_ex__ (REFERENCE.md §F: the reconstructors' argument order), so the pickles are
PyTorch's own, opcode for opcode, with no TransformerEngine code in them. The forms each released
TransformerEngine wrote, made by its own code, are tests/io/real_writers/make_te_float8.py's.
"""

import enum
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stub_modules import module  # noqa: E402


constants = module("transformer_engine.pytorch.constants")
te_torch = module("transformer_engine_torch")
float8_tensor = module("transformer_engine.pytorch.tensor.float8_tensor")


class DType(enum.IntEnum):
    """As TE's DType pickles (Python >= 3.12 enums, pybind11 enums): DType(code)."""

    kFloat8E4M3 = 7
    kFloat8E5M2 = 8

    def __reduce_ex__(self, protocol):
        return self.__class__, (int(self),)


class OldDType(enum.IntEnum):
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8

    def __reduce_ex__(self, protocol):
        return self.__class__, (int(self),)


DType.__module__, DType.__qualname__ = constants.__name__, "DType"
OldDType.__module__, OldDType.__qualname__ = te_torch.__name__, "DType"
constants.DType, te_torch.DType = DType, OldDType


def _make_float8_tensor_in_reduce_ex(data, fp8_dtype, fp8_scale_inv, dtype, shape,
                                     data_transpose=None):
    raise RuntimeError("never called by GroupLin")


_make_float8_tensor_in_reduce_ex.__module__ = float8_tensor.__name__
float8_tensor._make_float8_tensor_in_reduce_ex = _make_float8_tensor_in_reduce_ex


class Float8Tensor:
    def __init__(self, args, legacy):
        self.args, self.legacy = args, legacy

    @staticmethod
    def _make_in_reduce_ex(data, fp8_dtype, fp8_scale_inv, dtype, shape):
        raise RuntimeError("never called by GroupLin")

    def __reduce_ex__(self, protocol):
        fn = Float8Tensor._make_in_reduce_ex if self.legacy else _make_float8_tensor_in_reduce_ex
        return fn, self.args


mxfp8_tensor = module("transformer_engine.pytorch.tensor.mxfp8_tensor")


def _make_mxfp8_tensor_in_reduce_ex(rowwise_data, rowwise_scale_inv, columnwise_data,
                                    columnwise_scale_inv, fp8_dtype, dtype, shape, quantizer,
                                    with_gemm_swizzled_scales):
    raise RuntimeError("never called by GroupLin")


_make_mxfp8_tensor_in_reduce_ex.__module__ = mxfp8_tensor.__name__
mxfp8_tensor._make_mxfp8_tensor_in_reduce_ex = _make_mxfp8_tensor_in_reduce_ex


class MXFP8Quantizer:
    """Pickles as TE's does: NEWOBJ, then BUILD with its fields."""

    def __init__(self, fp8_dtype):
        self.rowwise_usage, self.columnwise_usage, self.internal = True, True, False
        self.dtype = fp8_dtype


MXFP8Quantizer.__module__ = mxfp8_tensor.__name__
mxfp8_tensor.MXFP8Quantizer = MXFP8Quantizer


class MXFP8Tensor:
    def __init__(self, args):
        self.args = args

    def __reduce_ex__(self, protocol):
        return _make_mxfp8_tensor_in_reduce_ex, self.args


def swizzle(padded):
    """cuBLAS's layout of [R, C] MX scales: 128 x 4 tiles, (r, c) at (r % 32) * 16 + (r / 32) * 4 + c."""
    rows, cols = padded.shape
    out = torch.empty(rows * cols, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * (cols // 4) + c // 4
            out[tile * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4] = padded[r, c]
    return out.reshape(rows, cols)


def mxfp8(swizzled):
    rows, cols = 130, 70
    k = torch.arange(rows * cols, dtype=torch.int64).reshape(rows, cols) % 256
    k = torch.where((k & 0x7F) == 0x7F, torch.full_like(k, 0x3F), k)
    data = k.to(torch.uint8)
    plain = torch.full((256, 4), 0xAA, dtype=torch.uint8)
    idx = torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3)
    plain[:rows, :3] = (20 + idx % 200).to(torch.uint8)
    scales = swizzle(plain) if swizzled else plain
    columnwise = None if swizzled else data.clone()
    columnwise_scales = None if swizzled else torch.zeros((8, 128), dtype=torch.uint8)
    return MXFP8Tensor((data, scales, columnwise, columnwise_scales, DType(7), torch.bfloat16,
                        torch.Size([rows, cols]), MXFP8Quantizer(DType(7)), swizzled))


Float8Tensor.__module__ = float8_tensor.__name__
Float8Tensor._make_in_reduce_ex.__module__ = float8_tensor.__name__
Float8Tensor._make_in_reduce_ex.__qualname__ = "Float8Tensor._make_in_reduce_ex"
float8_tensor.Float8Tensor = Float8Tensor


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    codes = torch.arange(0x10, 0x10 + 12, dtype=torch.uint8).reshape(3, 4)
    scale = torch.tensor([0.5], dtype=torch.float32)
    size = torch.Size([3, 4])
    b = torch.arange(4, dtype=torch.bfloat16)
    cases = {
        "te_float8": Float8Tensor((codes, DType(7), scale, torch.bfloat16, size), False),
        "te_float8_legacy": Float8Tensor((codes, OldDType(7), scale, torch.bfloat16, size), True),
        "te_float8_transpose": Float8Tensor(
            (None, DType(7), scale, torch.bfloat16, size, codes.t().contiguous()), False),
        "te_float8_e5m2": Float8Tensor((codes, DType(8), scale, torch.float32, size), False),
    }
    for name, w in cases.items():
        torch.save({"w": w, "b": b}, out / f"{name}.pt")
    torch.save({"w": mxfp8(False)}, out / "te_mxfp8.pt")
    torch.save({"w": mxfp8(True)}, out / "te_mxfp8_swizzled.pt")


if __name__ == "__main__":
    main()
