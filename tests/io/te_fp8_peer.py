"""TransformerEngine-style FP8 weights saved by PyTorch's own torch.save, for
tests/io/te_fp8_pickle_test.cpp and the .pt fuzz corpus.

Usage: te_fp8_peer.py OUT_DIR

Writes, each a state dict {"w": <Float8Tensor>, "b": <bf16 tensor>} (w's codes are 0x10 + k in
row-major order of its logical [3, 4] shape, its scale_inv 0.5):
  OUT_DIR/te_float8.pt            the reconstructor of TE >= 2.x
                                  (..float8_tensor._make_float8_tensor_in_reduce_ex), TE's DType
                                  from transformer_engine.pytorch.constants
  OUT_DIR/te_float8_legacy.pt     Float8Tensor._make_in_reduce_ex, a static method, which protocol 2
                                  pickles as getattr(Float8Tensor, '_make_in_reduce_ex'), and the
                                  older transformer_engine_torch.DType
  OUT_DIR/te_float8_transpose.pt  only the transpose kept ([4, 3]), data None
  OUT_DIR/te_float8_e5m2.pt       TE dtype 8 (float8 e5m2)

TransformerEngine itself is not installed: stand-in modules under its names give the objects the
same __reduce_ex__ (REFERENCE.md §F: the reconstructors' argument order), so the pickles are
PyTorch's own, opcode for opcode, with no TransformerEngine code in them.
"""

import enum
import sys
import types
from pathlib import Path

import torch


def module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        full = ".".join(parts[:i])
        if full not in sys.modules:
            sys.modules[full] = types.ModuleType(full)
        if i > 1:
            setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[full])
    return sys.modules[name]


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


def _make_float8_tensor_in_reduce_ex(data, fp8_dtype, fp8_scale_inv, dtype, shape, data_transpose):
    raise RuntimeError("never called by GroupLin")


_make_float8_tensor_in_reduce_ex.__module__ = float8_tensor.__name__
float8_tensor._make_float8_tensor_in_reduce_ex = _make_float8_tensor_in_reduce_ex


class Float8Tensor:
    def __init__(self, args, legacy):
        self.args, self.legacy = args, legacy

    @staticmethod
    def _make_in_reduce_ex(data, fp8_dtype, fp8_scale_inv, dtype, shape, data_transpose):
        raise RuntimeError("never called by GroupLin")

    def __reduce_ex__(self, protocol):
        fn = Float8Tensor._make_in_reduce_ex if self.legacy else _make_float8_tensor_in_reduce_ex
        return fn, self.args


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
        "te_float8": Float8Tensor((codes, DType(7), scale, torch.bfloat16, size, None), False),
        "te_float8_legacy": Float8Tensor((codes, OldDType(7), scale, torch.bfloat16, size, None),
                                         True),
        "te_float8_transpose": Float8Tensor(
            (None, DType(7), scale, torch.bfloat16, size, codes.t().contiguous()), False),
        "te_float8_e5m2": Float8Tensor((codes, DType(8), scale, torch.float32, size, None), False),
    }
    for name, w in cases.items():
        torch.save({"w": w, "b": b}, out / f"{name}.pt")


if __name__ == "__main__":
    main()
