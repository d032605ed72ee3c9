"""How GroupLin's dtypes appear as NumPy and PyTorch dtypes, and back.

NumPy has no BF16 or FP8 types of its own: with ``ml_dtypes`` installed these arrays use its
types (``ml_dtypes.bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``, ``float8_e8m0fnu``); without
it they are the raw codes, ``uint16`` for BF16 and ``uint8`` for the FP8 types (the bits, not
the values: ``grouplin.dtype_of`` tells which). PyTorch has BF16; its FP8 types (torch >= 2.1)
and unsigned 16-64-bit types (torch >= 2.3) are used where the installed torch has them,
otherwise ``uint8`` codes and the signed type of the same width.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

try:
    import ml_dtypes
except ImportError:  # the raw codes, as documented above
    ml_dtypes = None

# GroupLin dtype -> the ml_dtypes type's name, for the types NumPy lacks.
_ML_NAMES = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}
_RAW = {"BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8}

_TORCH_NAMES = {
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype GroupLin gives arrays of the GroupLin dtype ``name`` ("BF16", ...)."""
    if name in _ML_NAMES:
        if ml_dtypes is not None:
            return np.dtype(getattr(ml_dtypes, _ML_NAMES[name]))
        return np.dtype(_RAW[name])
    return {
        "F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "F64": np.dtype(np.float64),
        "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
        "I16": np.dtype(np.int16), "U16": np.dtype(np.uint16), "I32": np.dtype(np.int32),
        "U32": np.dtype(np.uint32), "I64": np.dtype(np.int64), "U64": np.dtype(np.uint64),
    }[name]


def numpy_view(array: np.ndarray, name: str) -> np.ndarray:
    """An array from the extension (raw codes for BF16/FP8) with its dtype for ``name``."""
    if name in _ML_NAMES and ml_dtypes is not None:
        return array.view(numpy_dtype(name))
    return array


def torch_view(tensor: Any, name: str) -> Any:
    """A tensor from the extension with torch's own dtype for ``name`` where torch has one."""
    import torch
    wanted = getattr(torch, _TORCH_NAMES.get(name, ""), None)
    if wanted is not None and tensor.dtype != wanted:
        return tensor.view(wanted)
    return tensor


def _ml_name(dtype: np.dtype) -> Optional[str]:
    if ml_dtypes is None:
        return None
    for name, ml in _ML_NAMES.items():
        if dtype == np.dtype(getattr(ml_dtypes, ml)):
            return name
    return None


def is_torch(value: Any) -> bool:
    """Whether ``value`` is a torch.Tensor (without importing torch when nobody did)."""
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def to_raw(value: Any, what: str) -> Tuple[Any, Optional[str]]:
    """``value`` (a NumPy array, a torch CPU tensor or anything ``numpy.asarray`` takes) as a
    C-contiguous array the extension reads without a copy, and the GroupLin dtype to read it as
    when it holds raw codes (None: its own dtype). Non-contiguous input is copied."""
    if is_torch(value):
        import torch
        t = value.detach()
        if t.device.type != "cpu":
            from ._errors import make_error
            raise make_error("InvalidArgument",
                             f"{what}: a tensor on {t.device}; GroupLin reads CPU tensors")
        if not t.is_contiguous():
            t = t.contiguous()
        for name, attr in _TORCH_NAMES.items():
            if name.startswith("F8") and t.dtype == getattr(torch, attr, None):
                return t.view(torch.uint8), name
        return t, None
    array = np.asarray(value)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    name = _ml_name(array.dtype)
    if name is not None:
        return array.view(_RAW[name]), name
    return array, None


def to_raw_lists(tensors: Any, dtypes: Any = None) -> Tuple[list, list, list]:
    """A mapping of name -> array as the extension takes it: names, raw arrays (to_raw) and
    their GroupLin dtypes (``dtypes`` names those of raw code arrays; None: as to_raw says)."""
    names, arrays, kinds = [], [], []
    for name, value in tensors.items():
        array, kind = to_raw(value, f"tensor {name!r}")
        names.append(name)
        arrays.append(array)
        kinds.append((dtypes or {}).get(name, kind))
    return names, arrays, kinds
