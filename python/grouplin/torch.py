"""GroupLin for PyTorch: checkpoints as torch tensors, and GroupedLinear as a torch.nn.Module.

    import grouplin.torch
    sd = grouplin.torch.load("te_fp8_checkpoint.pt")   # no pickle code runs, whatever the file
    layer = grouplin.torch.GroupedLinear(num_gemms=8, in_features=512, out_features=1024)
    y = layer(x, m_splits)                               # trains inside a torch model
    y.sum().backward()
    y = grouplin.torch.grouped_linear(x, m_splits, weight, bias)  # weight [N, out, in]: stateless

Tensors cross by DLPack in both directions without a copy.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch as _torch

from . import _core
from . import Checkpoint, _checkpoint, _path, _rules, PathLike, Rules
from ._dtypes import to_raw, to_raw_lists, torch_view
from ._errors import make_error

__all__ = ["GroupedLinear", "grouped_linear", "load", "use_torch_threads"]


def _openmp_runtime() -> Optional[str]:
    """The OpenMP runtime torch's ops run on (the path of the loaded library), or None when
    torch's parallel backend is not OpenMP or no such library is loaded."""
    if "parallel backend: OpenMP" not in _torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if line.count(" ") >= 5]
    except OSError:
        return None
    names = ("libgomp", "libiomp5", "libomp")
    runtimes = [p for p in paths
                if os.path.basename(p).startswith(names) and ".so" in os.path.basename(p)]
    # The copy torch ships beside itself first (another library may have loaded the system's).
    own = os.path.dirname(os.path.abspath(_torch.__file__)) + os.sep
    runtimes.sort(key=lambda p: not p.startswith(own))
    return runtimes[0] if runtimes else None


def use_torch_threads(on: bool = True) -> Optional[str]:
    """Runs GroupLin's kernels on torch's own OpenMP threads (``on``), or on GroupLin's threads.

    torch's OpenMP threads keep spinning for a while after each of its ops, on the cores GroupLin
    would run on: a GroupLin call between torch ops (a model's experts layer) then shares its
    cores with them. On torch's threads it does not; results are the same bits either way.
    ``import grouplin.torch`` turns it on where torch runs on OpenMP (set GROUPLIN_OWN_THREADS=1
    to keep GroupLin's). Returns the OpenMP library now in use, or None for GroupLin's threads;
    raises ``grouplin.Error`` (InvalidArgument) when asked to turn it on and torch's ops do not
    run on an OpenMP runtime this process has loaded."""
    if not on:
        _core.use_own_threads()
        return None
    library = _openmp_runtime()
    if library is None:
        raise make_error("InvalidArgument",
                         "use_torch_threads: expected torch's ops to run on an OpenMP runtime "
                         "loaded in this process; found parallel backend: "
                         + _torch.__config__.parallel_info().split("parallel backend:")[-1]
                         .strip())
    _core.use_openmp_threads(library)
    return library


def load(path: PathLike) -> Checkpoint:
    """Loads a checkpoint file (safetensors or .pt) or sharded directory as torch tensors.

    Safe for any file: .pt pickles are read by GroupLin's restricted reader (no code from the
    file runs), which also reads what ``torch.load(weights_only=True)`` refuses or cannot read
    (TransformerEngine's FP8 tensors, safetensors files, sharded directories). The tensors view
    a private copy-on-write mapping of the files: no copy at load, and a write into a tensor
    changes this process's memory, never the file. FP8 tensors are torch's float8 types where
    torch has them (>= 2.1), else uint8 codes (``Checkpoint.dtypes`` names them).
    """
    return _checkpoint(_core.load(_path(path), "torch"), torch_view)


def _raw_list(tensors: Any, what: str) -> Tuple[List[Any], Optional[str]]:
    """Tensors (None: none) as raw arrays for the extension, and their GroupLin dtype."""
    arrays, kind = [], None
    for t in tensors:
        if t is not None:
            array, kind = to_raw(t, what)
            arrays.append(array)
    return arrays, kind


def _grouped_forward(x: _torch.Tensor, m_splits: List[int], weights: Any, biases: Any,
                     scales: Any) -> _torch.Tensor:
    """The stateless forward over lists of tensors: one stacked [N, out, in] weight or N
    [out, in] ones (biases and FP8 scales alike, None entries left out)."""
    x_raw, x_kind = to_raw(x, "x")
    w_raw, w_kind = _raw_list(weights, "weight")
    b_raw, b_kind = _raw_list(biases, "bias")
    s_raw, _ = _raw_list(scales, "weight_scale_inv")
    return _core.grouped_linear_forward(x_raw, x_kind, m_splits, w_raw, w_kind, s_raw, b_raw,
                                        b_kind, "torch")


def _grouped_backward(x: _torch.Tensor, dy: _torch.Tensor, m_splits: List[int], weights: Any,
                      biases: Any, scales: Any, dx: bool, dw: bool, db: bool,
                      weight_dtype: Optional[str] = None) -> Any:
    """(dx, dw [N, out, in], db [N, out]) of _grouped_forward; None for what is not asked.
    `weight_dtype` names the weights' GroupLin dtype where torch cannot (FP8 codes as uint8)."""
    x_raw, x_kind = to_raw(x, "x")
    dy_raw, _ = to_raw(dy.to(x.dtype), "dy")
    w_raw, w_kind = _raw_list(weights, "weight")
    w_kind = weight_dtype or w_kind
    b_raw, b_kind = _raw_list(biases, "bias")
    s_raw, _ = _raw_list(scales, "weight_scale_inv")
    return _core.grouped_linear_backward(x_raw, x_kind, dy_raw, m_splits, w_raw, w_kind, s_raw,
                                         b_raw, b_kind, dx, dw, db, "torch")


class _GroupedLinearFunction(_torch.autograd.Function):
    """y = x_i · W_iᵀ + b_i for autograd, stateless: each forward's own inputs are saved, so any
    number of forwards may come before their backwards."""

    @staticmethod
    def forward(ctx: Any, x: _torch.Tensor, m_splits: List[int], weight: _torch.Tensor,
                bias: Optional[_torch.Tensor], scales: Optional[_torch.Tensor]) -> _torch.Tensor:
        ctx.m_splits = m_splits
        ctx.save_for_backward(x, weight, bias, scales)
        return _grouped_forward(x, m_splits, [weight], [bias], [scales])

    @staticmethod
    def backward(ctx: Any, dy: _torch.Tensor) -> Any:
        x, weight, bias, scales = ctx.saved_tensors
        want_dx, _, want_dw, want_db, _ = ctx.needs_input_grad
        dx, dw, db = _grouped_backward(x, dy, ctx.m_splits, [weight], [bias], [scales],
                                       bool(want_dx), bool(want_dw),
                                       bool(want_db and bias is not None))
        return dx, None, dw, db, None


def _splits(m_splits: Any) -> List[int]:
    return [int(m) for m in (m_splits.tolist() if hasattr(m_splits, "tolist") else m_splits)]


def grouped_linear(x: _torch.Tensor, m_splits: Any, weight: _torch.Tensor,
                   bias: Optional[_torch.Tensor] = None,
                   weight_scale_inv: Optional[_torch.Tensor] = None) -> _torch.Tensor:
    """y [T, out] for x [T, in] split by ``m_splits`` (ints, or a tensor of them): rows of
    expert i times ``weight[i]ᵀ`` (``weight`` [N, out, in], F32 or BF16 as x; or float8_e4m3fn
    codes with ``weight_scale_inv`` [N, ceil(out/128), ceil(in/128)], beside F32 or BF16 x), plus
    ``bias[i]`` ([N, out]). Stateless and differentiable in x, weight and bias (FP8 weights have
    no gradient): GroupLin's grouped GEMM, the bits of ``GroupedLinear``. Nothing is copied
    unless an input is not contiguous."""
    return _GroupedLinearFunction.apply(x, _splits(m_splits), weight, bias, weight_scale_inv)


class _LayerFunction(_torch.autograd.Function):
    """GroupedLinear's forward (the C++ layer's, packed weights and all) and backward (the
    stateless one, from this forward's own input): any number of forwards may come before their
    backwards, and none is run again. The parameters are saved too, so that autograd refuses a
    backward after they were changed in place (as for any torch op), instead of differentiating
    at other weights."""

    @staticmethod
    def forward(ctx: Any, module: "GroupedLinear", m_splits: List[int], x: _torch.Tensor,
                *params: _torch.Tensor) -> _torch.Tensor:
        ctx.module = module
        ctx.m_splits = m_splits
        ctx.save_for_backward(x, *params)
        return module._run_forward(x, m_splits)

    @staticmethod
    def backward(ctx: Any, dy: _torch.Tensor) -> Any:
        x = ctx.saved_tensors[0]
        return (None, None, *ctx.module._run_backward(x, ctx.m_splits, dy,
                                                      ctx.needs_input_grad[2]))


class GroupedLinear(_torch.nn.Module):
    """GroupLin's GroupedLinear as a ``torch.nn.Module``: ``layer(x, m_splits)``.

    Its parameters (``weight0`` .. ``weight{N-1}`` and ``bias{i}`` in the per-expert and
    contiguous layouts, ``weight [N, out, in]`` and ``bias [N, out]`` in the single layout) are
    torch views of the C++ layer's own memory: torch optimizers update them in place, and
    ``state_dict()`` has TransformerEngine's names. Gradients reach them through autograd.
    FP8 weights (``params_dtype="F8_E4M3"``) are buffers, for inference.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: Any = "F32", weight_layout: Optional[str] = None, seed: int = 0,
                 activation_dtype: Any = None, bias_layout: Optional[str] = None) -> None:
        super().__init__()
        self._core = _core.GroupedLinear(num_gemms, in_features, out_features, bias,
                                         _dtype_name(params_dtype),
                                         None if activation_dtype is None
                                         else _dtype_name(activation_dtype),
                                         weight_layout, bias_layout, seed, False)
        self._lock = threading.Lock()
        self._packed_versions: Any = None  # the weights' (name, address, version) when packed
        self._bind()

    def _dtype_of(self, name: str) -> str:
        """The GroupLin dtype of the parameter `name` (weights, or biases)."""
        weight = name.startswith("weight")
        return self._core.params_dtype if weight else self._core.activation_dtype

    def _bind(self) -> None:
        """Registers the C++ layer's parameters and buffers as torch views of them."""
        trainable = self._core.params_dtype != "F8_E4M3"
        for name, value, _ in self._core.parameters("torch"):
            value = torch_view(value, self._dtype_of(name))
            if trainable or not name.startswith("weight"):
                self.register_parameter(name, _torch.nn.Parameter(value, requires_grad=True))
            else:
                self.register_buffer(name, value)
        for name, dtype, value in self._core.state_dict("", "torch"):
            if name not in self._parameters and name not in self._buffers:
                self.register_buffer(name, torch_view(value, dtype))

    num_gemms = property(lambda self: self._core.num_gemms)
    in_features = property(lambda self: self._core.in_features)
    out_features = property(lambda self: self._core.out_features)
    weight_layout = property(lambda self: self._core.weight_layout)

    def _ordered_params(self) -> List[_torch.Tensor]:
        return [getattr(self, name) for name, _, _ in self._core.parameters("torch")]

    def set_weight_packing(self, on: bool = True) -> None:
        """Forward reads the weights from a packed copy, for many forwards with the same
        weights (``grouplin.GroupedLinear.set_weight_packing``). Writes by PyTorch (an optimizer
        step, ``load_state_dict``, any in-place op on a parameter) are seen through the
        parameters' version counters: the next forward packs again."""
        with self._lock:
            self._core.set_weight_packing(bool(on))
            self._packed_versions = None

    weight_packing = property(lambda self: self._core.weight_packing)
    packed_weight_bytes = property(lambda self: self._core.packed_weight_bytes)

    def _note_weight_writes(self) -> None:
        """With weight packing on: tells the layer when PyTorch wrote a weight since the last
        forward (its version counter moved), which the layer cannot see itself."""
        if not self._core.weight_packing:
            return
        versions = tuple((name, t.data_ptr(), t._version) for name, t in
                         list(self._parameters.items()) + list(self._buffers.items())
                         if t is not None and name.startswith("weight"))
        if versions != self._packed_versions:
            self._core.mark_weights_written()
            self._packed_versions = versions

    def _run_forward(self, x: _torch.Tensor, m_splits: List[int]) -> _torch.Tensor:
        array, kind = to_raw(x, "x")
        with self._lock:
            self._note_weight_writes()
            return self._core.forward(array, kind, m_splits, "torch")

    def _experts(self) -> Tuple[List[_torch.Tensor], List[_torch.Tensor], List[_torch.Tensor]]:
        """The layer's weights, biases and FP8 scales as torch tensors (stacked or per expert)."""
        n = self.num_gemms
        def listed(stacked: str, each: str) -> List[_torch.Tensor]:
            if hasattr(self, stacked):
                return [getattr(self, stacked)]
            return [getattr(self, each.format(i)) for i in range(n) if hasattr(self, each.format(i))]
        return (listed("weight", "weight{}"), listed("bias", "bias{}"),
                listed("weight_scale_inv", "weight{}_scale_inv"))

    def _run_backward(self, x: _torch.Tensor, m_splits: List[int], dy: _torch.Tensor,
                      want_dx: bool) -> List[Optional[_torch.Tensor]]:
        """dx, then one gradient per parameter (None where none is needed)."""
        weights, biases, scales = self._experts()
        names = [name for name, _, _ in self._core.parameters("torch")]
        wanted = {name: self._parameters.get(name) is not None and
                  self._parameters[name].requires_grad for name in names}
        want_dw = any(v for k, v in wanted.items() if k.startswith("weight"))
        want_db = any(v for k, v in wanted.items() if k.startswith("bias"))
        fp8 = self._core.params_dtype == "F8_E4M3"
        dx, dw, db = _grouped_backward(x, dy, m_splits, weights, biases, scales, want_dx,
                                       want_dw, want_db, "F8_E4M3" if fp8 else None)
        grads: List[Optional[_torch.Tensor]] = [dx]
        for name in names:
            whole = dw if name.startswith("weight") else db
            if not wanted[name] or whole is None:
                grads.append(None)
            elif name in ("weight", "bias"):
                grads.append(whole)
            else:
                grads.append(whole[int(name[len("weight" if name.startswith("weight") else "bias"):])])
        return grads

    def forward(self, x: _torch.Tensor, m_splits: Any) -> _torch.Tensor:
        """y [T, out] for x [T, in] split by m_splits (ints, or a tensor of them)."""
        splits = [int(m) for m in (m_splits.tolist() if hasattr(m_splits, "tolist")
                                   else m_splits)]
        params = self._ordered_params()
        if _torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            return _LayerFunction.apply(self, splits, x, *params)
        return self._run_forward(x, splits)

    def load_grouplin_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                                 prefix: str = "", rules: Rules = None,
                                 model_type: str = "") -> Dict[str, Any]:
        """Loads entries of any layout (per-expert, stacked, a Hugging Face family's names
        through ``rules``) into this layer's layout, all or nothing; returns GroupLin's report.
        ``load_state_dict`` (torch's) needs this layer's own names and shapes."""
        names, arrays, kinds = to_raw_lists(state_dict)
        with self._lock:
            report = self._core.load_state_dict(names, arrays, kinds, strict, prefix,
                                                _rules(rules), model_type)
        with _torch.no_grad():  # where the load gave a parameter new memory, follow it
            for name, value, _ in self._core.parameters("torch"):
                current = getattr(self, name)
                if current.data_ptr() != value.data_ptr():
                    current.data = torch_view(value, self._dtype_of(name))
        return report

    def get_extra_state(self) -> Any:
        """TransformerEngine's ``_extra_state`` entry, which this layer keeps as a buffer of that
        name: torch's ``state_dict`` writes it as it is."""
        return self._buffers.get("_extra_state")

    def set_extra_state(self, state: Any) -> None:
        """torch's ``load_state_dict`` loads ``_extra_state`` with the other buffers; defined so
        that a strict load of this layer's own ``state_dict`` does not call it unexpected."""

    def extra_repr(self) -> str:
        """The sizes and layout, for print(module)."""
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
                f"out_features={self.out_features}, weight_layout={self.weight_layout!r}")


def _dtype_name(dtype: Any) -> str:
    """"F32", "BF16", "F8_E4M3" from those names or from torch dtypes."""
    if isinstance(dtype, str):
        return dtype
    names = {_torch.float32: "F32", _torch.bfloat16: "BF16"}
    fp8 = getattr(_torch, "float8_e4m3fn", None)
    if fp8 is not None:
        names[fp8] = "F8_E4M3"
    if dtype not in names:
        from ._errors import make_error
        raise make_error("UnsupportedDType", f"params_dtype {dtype}: expected torch.float32, "
                         "torch.bfloat16, torch.float8_e4m3fn or their GroupLin names")
    return names[dtype]


# Where torch's ops run on OpenMP, GroupLin's calls between them run on the same threads
# (use_torch_threads says why); GROUPLIN_OWN_THREADS=1 keeps GroupLin's own.
if os.environ.get("GROUPLIN_OWN_THREADS", "") != "1":
    _library = _openmp_runtime()
    if _library is not None:
        _core.use_openmp_threads(_library)
