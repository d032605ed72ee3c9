"""GroupLin for Python: Mixture-of-Experts grouped linear layers and their checkpoints.

Checkpoints (safetensors or PyTorch ``.pt`` files, or sharded Hugging Face directories)::

    import grouplin
    tensors = grouplin.load("Qwen3-30B-A3B/")        # read-only NumPy views of the mapped files
    doc = grouplin.inspect("Qwen3-30B-A3B/")           # the document of `grouplin inspect --json`
    grouplin.convert("Qwen3-30B-A3B/", "fused/", layout="single")
    assert grouplin.verify("Qwen3-30B-A3B/", "fused/").same

The layer, on NumPy arrays or torch CPU tensors (``grouplin.torch.GroupedLinear`` is the
``torch.nn.Module``)::

    layer = grouplin.GroupedLinear(num_gemms=8, in_features=512, out_features=1024)
    y = layer.forward(x, m_splits=[3, 0, 5, 2, 2, 0, 1, 3])
    dx = layer.backward(dy)

Every error is a ``grouplin.Error`` with ``.code``, ``.message`` and ``.problems``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._dtypes import is_torch, numpy_dtype, numpy_view, to_raw, to_raw_lists, torch_view
from ._errors import Error, Problem

__version__: str = _core.__version__

__all__ = [
    "Checkpoint", "Error", "GroupedLinear", "Problem", "VerifyResult", "convert", "dtype_of",
    "inspect", "load", "numpy_dtype", "rule_names", "save", "verify", "__version__",
]

PathLike = Union[str, "os.PathLike[str]"]
Rules = Union[None, str, Sequence[str]]


class Checkpoint(Dict[str, Any]):
    """What ``load`` returns: a dict of tensor name to array, in file order (a directory: in
    natural key order), with what the file says besides its tensors."""

    metadata: Dict[str, str]
    """The safetensors ``__metadata__`` (of a directory: the entries all shards agree on)."""
    format: str
    """``"safetensors"`` or ``"pt"``."""
    model_type: str
    """A directory's config.json ``model_type`` ("" when none)."""
    shards: List[str]
    """A directory's shard files, relative to it (empty for a file)."""
    warnings: List[Problem]
    """What the checkpoint gets wrong without stopping the load (an index's total_size)."""
    dtypes: Dict[str, str]
    """Each tensor's GroupLin dtype ("BF16", "F8_E4M3", ...): what raw codes mean."""


def _checkpoint(raw: Dict[str, Any], view: Callable[[Any, str], Any]) -> Checkpoint:
    c = Checkpoint()
    c.dtypes = {}
    for name, dtype, array in raw["tensors"]:
        c[name] = view(array, dtype)
        c.dtypes[name] = dtype
    c.metadata = dict(raw["metadata"])
    c.format = raw["format"]
    c.model_type = raw["model_type"]
    c.shards = list(raw["shards"])
    c.warnings = [Problem(*w) for w in raw["warnings"]]
    return c


def _path(p: PathLike) -> str:
    return os.fspath(p)


def _rules(rules: Rules) -> List[str]:
    if rules is None or rules == "auto":
        return []
    if isinstance(rules, (str, os.PathLike)):
        return [os.fspath(rules)]
    return [os.fspath(r) for r in rules]


def load(path: PathLike) -> Checkpoint:
    """Loads a checkpoint file (safetensors or .pt, by content) or a sharded directory.

    The arrays are read-only NumPy views of the mapped files, without a copy: the mapping lives
    as long as any array from it does. Nothing in the file is ever executed (.pt pickles go
    through GroupLin's restricted reader). BF16 and FP8 arrays use ml_dtypes types when it is
    installed, else raw codes (``Checkpoint.dtypes`` names them). Raises ``Error``.
    """
    return _checkpoint(_core.load(_path(path), "numpy"), numpy_view)


def save(path: PathLike, tensors: Mapping[str, Any], format: Optional[str] = None,
         metadata: Optional[Mapping[str, str]] = None,
         dtypes: Optional[Mapping[str, str]] = None) -> None:
    """Writes ``tensors`` (name -> NumPy array, torch CPU tensor or anything numpy.asarray
    takes) as one checkpoint file, atomically: a temporary file renamed over ``path`` once
    complete, so a failure leaves any old file untouched.

    ``format`` is "safetensors" or "pt" (None: from the extension, else safetensors);
    ``metadata`` goes to the safetensors header. ``dtypes`` names the GroupLin dtype of raw
    code arrays ({"w": "BF16"} for a uint16 array of BF16 bits); ml_dtypes and torch BF16/FP8
    arrays need none. The arrays are read in place (non-contiguous ones copied first).
    """
    names, arrays, kinds = to_raw_lists(tensors, dtypes)
    _core.save(_path(path), names, arrays, kinds, format, dict(metadata or {}))


def inspect(path: PathLike, rules: Rules = None, model_type: str = "",
            state_dict_key: str = "") -> Dict[str, Any]:
    """What a checkpoint holds, from its headers only: the document of ``grouplin inspect
    --json`` as a dict (keys ``tensors``, ``grouped_modules``, ``problems``, ``warnings``,
    ``totals``, ...; schema in docs/cli.md). Raises ``Error`` for an unreadable file; an
    inconsistent expert set is listed under ``problems`` instead. ``state_dict_key``: of a .pt
    training checkpoint with several dicts of tensors, the top-level key of the one to read."""
    return json.loads(_core.inspect(_path(path), _rules(rules), model_type, state_dict_key))


def _progress_printer() -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        pct = 100.0 * done / total if total else 100.0
        sys.stderr.write(f"\rconverting: {done / 2**20:.1f} of {total / 2**20:.1f} MiB "
                         f"({pct:.0f}%)")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def convert(src: PathLike, dst: PathLike, layout: str = "single", format: Optional[str] = None,
            rules: Rules = None, experts: Optional[Tuple[int, int]] = None,
            max_shard_size: Union[None, int, str] = None, force: bool = False,
            progress: Union[bool, Callable[[int, int], None]] = False,
            dtype: Optional[str] = None, model_type: str = "",
            state_dict_key: str = "") -> Dict[str, Any]:
    """Rewrites every grouped module of the checkpoint ``src`` in one ``layout`` ("single":
    stacked ``[N, out, in]`` tensors, "per-expert", or "keep": the layout src has, for a change
    of format, sharding, dtype or experts only) into ``dst``, streaming: every other
    tensor is copied unchanged, memory stays about 1 MiB whatever the size, nothing is left at
    ``dst`` on failure. As ``grouplin convert``:

    - ``format``: "safetensors" or "pt" (None: a directory's own, else from dst's extension);
    - ``rules``: rule set names (``rule_names()``) or JSON files; None detects them;
    - ``experts``: ``(begin, end)`` keeps experts [begin, end) of every module, renumbered;
    - ``max_shard_size``: bytes or "5GB": dst becomes a directory of shards;
    - ``force``: replace an existing dst; ``dtype``: "F32", "BF16" or "F16" dequantizes FP8
      weights (and drops their scales);
    - ``progress``: True prints progress to stderr; a callable gets (done, total) bytes;
    - ``state_dict_key``: of a .pt training checkpoint with several dicts of tensors (Megatron's
      model0, model1), the top-level key of the one to read.

    Ctrl-C stops the conversion (KeyboardInterrupt; dst is left as it was). Returns the report
    as a dict, the document of ``grouplin convert --json`` (tensors, bytes, files written;
    ``rules``: the rule sets that found the modules, ``rules_from``: "given", "model_type" (config.json) or "names"; ``warnings``). Raises
    ``Error``, also when nothing would change (a layout without grouped modules and nothing
    else to do: ``NoGroupedModules``; docs/cli.md, "Nothing to change").
    """
    if isinstance(max_shard_size, str):
        max_shard_size = _core.parse_byte_size(max_shard_size)
    callback = _progress_printer() if progress is True else (progress or None)
    if dtype is not None:
        dtype = {"f32": "F32", "bf16": "BF16", "f16": "F16"}.get(dtype, dtype)
    return json.loads(_core.convert(_path(src), _path(dst), layout, format, _rules(rules),
                                    tuple(experts) if experts is not None else None,
                                    max_shard_size, force, callback, dtype, model_type,
                                    state_dict_key))


@dataclass
class VerifyResult:
    """What ``verify`` found: ``same`` when every entry has the same dtype, shape and bytes."""

    same: bool
    differences: List[str] = field(default_factory=list)
    """The first ``max_listed`` differing entries, one line each."""
    differing: int = 0
    """How many entries differ in all."""
    tensors_compared: int = 0
    bytes_compared: int = 0
    warnings: List[Problem] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.same


def verify(a: PathLike, b: PathLike, max_listed: int = 10, rules: Rules = None,
           model_type: str = "", state_dict_key: str = "") -> VerifyResult:
    """Compares the values of two checkpoints whatever their layouts and formats (files or
    directories), bit for bit, reading 256 KiB at a time. Raises ``Error`` for a checkpoint
    that cannot be read."""
    r = json.loads(_core.verify(_path(a), _path(b), max_listed, _rules(rules), model_type,
                                state_dict_key))
    return VerifyResult(same=r["same"], differences=list(r["differences"]),
                        differing=r["differing"], tensors_compared=r["tensors_compared"],
                        bytes_compared=r["bytes_compared"],
                        warnings=[Problem(w["code"], w["key"], w["message"])
                                  for w in r["warnings"]])


def rule_names() -> List[str]:
    """The built-in rule sets' names ("te", "hf", "hf-mixtral", ...)."""
    return list(_core.rule_names())


def dtype_of(checkpoint: Checkpoint, name: str) -> str:
    """The GroupLin dtype of one of a checkpoint's tensors ("BF16", "F8_E4M3", ...)."""
    return checkpoint.dtypes[name]


class GroupedLinear:
    """N experts: ``y_i = x_i W_i^T + b_i`` over the rows of x split by ``m_splits``.

    ``params_dtype`` "F32", "BF16" or "F8_E4M3" (FP8 weights with 128 x 128 block scales, for
    inference); ``weight_layout`` "per-expert", "contiguous" or "single" (None: per-expert, or
    contiguous when NVTE_ALLOC_CONTIGUOUS_GROUPED_LINEAR_WEIGHTS is set). Initialisation is a
    pure function of ``seed`` and the options, the same in every layout.

    ``forward``/``backward`` take NumPy arrays or torch CPU tensors and answer in kind; the
    layer keeps x alive for backward. Calls on one layer from several threads are serialized.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: str = "F32", weight_layout: Optional[str] = None,
                 seed: int = 0, activation_dtype: Optional[str] = None,
                 bias_layout: Optional[str] = None,
                 fuse_wgrad_accumulation: bool = False) -> None:
        self._core = _core.GroupedLinear(num_gemms, in_features, out_features, bias,
                                         params_dtype, activation_dtype, weight_layout,
                                         bias_layout, seed, fuse_wgrad_accumulation)
        self._torch_output = False

    num_gemms = property(lambda self: self._core.num_gemms, doc="N, the number of experts.")
    in_features = property(lambda self: self._core.in_features)
    out_features = property(lambda self: self._core.out_features)
    params_dtype = property(lambda self: self._core.params_dtype, doc="\"F32\", \"BF16\", ...")
    activation_dtype = property(lambda self: self._core.activation_dtype,
                                doc="The dtype of x, y, dy, dx and the biases.")
    weight_layout = property(lambda self: self._core.weight_layout)

    def _arg(self, value: Any, what: str) -> Tuple[Any, Optional[str], str]:
        array, kind = to_raw(value, what)
        framework = "torch" if is_torch(value) else "numpy"
        if kind is None and self.activation_dtype == "BF16" and framework == "numpy" \
                and array.dtype == np.uint16:
            kind = "BF16"  # raw BF16 codes (no ml_dtypes)
        return array, kind, framework

    def _out(self, array: Any, framework: str, dtype: str) -> Any:
        return torch_view(array, dtype) if framework == "torch" else numpy_view(array, dtype)

    def forward(self, x: Any, m_splits: Iterable[int]) -> Any:
        """y [T, out] for x [T, in] whose first m_splits[0] rows go to expert 0, and so on."""
        array, kind, framework = self._arg(x, "x")
        splits = [int(m) for m in (m_splits.tolist() if hasattr(m_splits, "tolist")
                                   else m_splits)]
        y = self._core.forward(array, kind, splits, framework)
        return self._out(y, framework, self.activation_dtype)

    __call__ = forward

    def backward(self, dy: Any) -> Any:
        """dx [T, in] for dy [T, out] of the last forward; fills the gradients."""
        array, kind, framework = self._arg(dy, "dy")
        dx = self._core.backward(array, kind, framework)
        return self._out(dx, framework, self.activation_dtype)

    def set_weight_packing(self, on: bool = True) -> None:
        """For many forwards with the same weights (inference): forward reads the weights from
        a copy in the layout the matrix kernels multiply (BF16 weights and activations on a CPU
        with AVX512-BF16 or AMX; elsewhere nothing is kept), made at the first forward and again
        after a change through GroupLin (load_state_dict). Same results; costs
        ``packed_weight_bytes``. Writes through views (``expert_weight``, ``state_dict``) are not
        seen: call ``mark_weights_written`` after them."""
        self._core.set_weight_packing(bool(on))

    weight_packing = property(lambda self: self._core.weight_packing,
                              doc="Whether weight packing is on.")
    packed_weight_bytes = property(lambda self: self._core.packed_weight_bytes,
                                   doc="Bytes of the packed copy of the weights.")

    def mark_weights_written(self) -> None:
        """The weights were written through views: the next forward packs them again."""
        self._core.mark_weights_written()

    def _view(self, getter: Callable[[int, str], Any], i: int, dtype: str) -> Any:
        v = getter(i, "numpy")
        return None if v is None else numpy_view(v, dtype)

    def expert_weight(self, i: int) -> np.ndarray:
        """View (no copy) of expert i's weight [out, in]: writing into it changes the layer."""
        return self._view(self._core.expert_weight, i, self.params_dtype)

    def expert_weight_scale(self, i: int) -> Optional[np.ndarray]:
        """Expert i's FP8 block scales [ceil(out/128), ceil(in/128)] (None unless FP8)."""
        return self._view(self._core.expert_weight_scale, i, "F32")

    def expert_bias(self, i: int) -> Optional[np.ndarray]:
        """View of expert i's bias [out] (None without bias)."""
        return self._view(self._core.expert_bias, i, self.activation_dtype)

    def expert_weight_grad(self, i: int) -> Optional[np.ndarray]:
        """View of expert i's weight gradient (None before the first backward)."""
        return self._view(self._core.expert_weight_grad, i, self.params_dtype)

    def expert_bias_grad(self, i: int) -> Optional[np.ndarray]:
        """View of expert i's bias gradient (None before the first backward or without bias)."""
        return self._view(self._core.expert_bias_grad, i, self.activation_dtype)

    def state_dict(self, prefix: str = "") -> Dict[str, np.ndarray]:
        """Parameters and buffers by name (this layer's layout's names), as views."""
        return {name: numpy_view(a, dtype) for name, dtype, a in
                self._core.state_dict(prefix, "numpy")}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        prefix: str = "", rules: Rules = None,
                        model_type: str = "") -> Dict[str, Any]:
        """Loads entries of any layout (per-expert ``weight{i}``, stacked ``weight``, a
        Hugging Face family's names through ``rules``) into this layer's layout, all or
        nothing, copying the values. Returns the report (loaded, missing, unexpected, ...)."""
        names, arrays, kinds = to_raw_lists(state_dict)
        return self._core.load_state_dict(names, arrays, kinds, strict, prefix, _rules(rules),
                                          model_type)

    def __repr__(self) -> str:
        return (f"grouplin.GroupedLinear(num_gemms={self.num_gemms}, in_features="
                f"{self.in_features}, out_features={self.out_features}, params_dtype="
                f"{self.params_dtype!r}, weight_layout={self.weight_layout!r})")
