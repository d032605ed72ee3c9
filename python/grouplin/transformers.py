"""GroupLin as an experts backend of transformers (5.x): the experts of every MoE model whose
experts class transformers decorates with ``use_experts_implementation`` run on GroupLin.

    import grouplin.transformers                     # registers the backend "grouplin"
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="grouplin")
    model.set_experts_implementation("grouplin")     # or switch a loaded model over

What runs where. A module whose gate GroupLin recognises runs whole in C++ (GroupLin's expert
block: routing by a stable counting sort, both grouped projections, the gate, the weighted
combine in F32, forward and backward). The gate is recognised by trying it: the first time a
kind of module is seen, each gate GroupLin has (``none``, ``multiply``, ``clamp_before``,
``clamp_after``, ``glu_plus_one``, with each activation, both column orders, and the module's
``limit``/``alpha`` attributes) is run through the C++ block on probe rows and compared with the
module's own ``_apply_gate`` (or ``act_fn`` without a gate); the first that agrees is used, so a
gate is never taken for another. A module with no agreeing gate, or with a ``post_expert_norm``,
runs the two projections on GroupLin's grouped GEMM and its own Python gate and norm between them
(said once in a debug log). Sentinel ids (>= num_experts, expert parallelism) add nothing. The
module's parameters are read in place, in either orientation (``is_transposed``), never copied.
CPU tensors only.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

import torch

from . import _core
from ._dtypes import to_raw
from .torch import _raw_list, grouped_linear

__all__ = ["NAME", "register", "experts_forward", "gate_of", "use_fp8_experts"]

NAME = "grouplin"
_log = logging.getLogger(__name__)

# Gate = (kind, activation, interleaved, limit or None, alpha), as _core takes it.
Gate = Tuple[str, str, bool, Optional[float], float]

# Where a module keeps its gate's parameters (data: the attribute names transformers' families
# use); each value found is tried, and no limit.
_LIMIT_ATTRS = ("limit", "swiglu_limit")
_ALPHA_ATTRS = ("alpha", "swiglu_alpha")
_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu", "relu2")
_KINDS = ("multiply", "clamp_before", "clamp_after", "glu_plus_one")
_DEFAULT_ALPHA = 1.702

_gates: Dict[Any, Optional[Gate]] = {}
_said: set = set()


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _candidates(module: Any):
    """Every gate GroupLin could run for this module, the commonest first."""
    if not module.has_gate:
        for act in _ACTIVATIONS:
            yield ("none", act, False, None, _DEFAULT_ALPHA)
        return
    limits = [_number(getattr(module, a, None)) for a in _LIMIT_ATTRS]
    limits = [v for v in limits if v is not None]
    alphas = [_number(getattr(module, a, None)) for a in _ALPHA_ATTRS]
    alphas = [v for v in alphas if v is not None] or [_DEFAULT_ALPHA]
    for kind in _KINDS:
        for interleaved in (False, True):
            if kind == "multiply":
                for act in _ACTIVATIONS:
                    yield (kind, act, interleaved, None, _DEFAULT_ALPHA)
            elif kind == "glu_plus_one":
                for limit in limits or [None]:
                    for alpha in alphas:
                        yield (kind, "silu", interleaved, limit, alpha)
            else:
                for limit in limits:
                    for act in _ACTIVATIONS:
                        yield (kind, act, interleaved, limit, _DEFAULT_ALPHA)


def _run_gate(gate: Gate, h: torch.Tensor) -> torch.Tensor:
    """gate(h) for h [R, 2I] (or [R, I]) F32, computed by GroupLin's C++ expert block: one
    expert whose first projection is the identity and whose down projection passes the gate's
    output through unchanged (exact in F32)."""
    rows, width_in = h.shape
    width = width_in if gate[0] == "none" else width_in // 2
    first = torch.eye(width_in).unsqueeze(0)
    down = torch.zeros(1, width_in, width)
    down[0, :width, :] = torch.eye(width)
    index = torch.zeros(rows, 1, dtype=torch.int64)
    weights = torch.ones(rows, 1)
    arrays = _core.ExpertBlockArrays([first], [], [], [down], [], [])
    out, _ = _core.expert_block_forward(h.contiguous(), None, index, weights, None, arrays, None,
                                        None, False, gate, False, "torch")
    return out[:, :width]


def gate_of(module: Any) -> Optional[Gate]:
    """The gate GroupLin runs for this experts module in C++, or None when none of its gates
    computes what the module's own does (then the module's Python gate runs)."""
    limits = tuple(getattr(module, a, None) for a in _LIMIT_ATTRS + _ALPHA_ATTRS)
    act = getattr(module, "act_fn", None)
    apply_gate = getattr(module, "_apply_gate", None)
    key = (type(module), module.has_gate, limits, type(act),
           repr(act) if isinstance(act, torch.nn.Module) else act,
           getattr(apply_gate, "__func__", apply_gate))
    if key in _gates:
        return _gates[key]
    bound = max([abs(v) for v in map(_number, limits) if v is not None] + [2.0])
    generator = torch.Generator().manual_seed(0)
    width = 16
    h = (torch.rand(48, 2 * width if module.has_gate else width, generator=generator) * 2 - 1)
    h = h * (2 * bound)
    with torch.no_grad():
        try:
            want = module._apply_gate(h.clone()) if module.has_gate else module.act_fn(h.clone())
        except Exception:  # a gate that cannot run on probe rows is not one GroupLin knows
            want = None
    found = None
    if want is not None and want.shape == (h.shape[0], width):
        scale = float(want.abs().max()) + 1e-6
        for gate in _candidates(module):
            got = _run_gate(gate, h)
            if float((got - want.float()).abs().max()) <= 2e-6 * scale:
                found = gate
                break
    _gates[key] = found
    return found


def _say_once(module: Any, why: str) -> None:
    name = type(module).__name__
    if name not in _said:
        _said.add(name)
        _log.debug("grouplin experts of %s: %s; its Python gate runs between GroupLin's "
                   "projections", name, why)


def _raw(t: Optional[torch.Tensor], what: str):
    return _raw_list([t], what)[0]


def _arrays(first, first_bias, down, down_bias, first_scales=None, down_scales=None):
    return _core.ExpertBlockArrays(_raw(first, "gate_up_proj"), _raw(first_scales, "scales"),
                                   _raw(first_bias, "gate_up_proj_bias"), _raw(down, "down_proj"),
                                   _raw(down_scales, "scales"), _raw(down_bias, "down_proj_bias"))


def _block_forward(spec: Dict[str, Any], hidden, index, routing, first, first_bias, down,
                   down_bias, save: bool):
    h_raw, h_kind = to_raw(hidden, "hidden_states")
    r_raw, r_kind = to_raw(routing, "top_k_weights")
    return _core.expert_block_forward(
        h_raw, h_kind, to_raw(index, "top_k_index")[0], r_raw, r_kind,
        _arrays(first, first_bias, down, down_bias, spec["first_scales"], spec["down_scales"]),
        spec["weight_dtype"], None, spec["transposed"], spec["gate"], save, "torch")


class _ExpertBlockFunction(torch.autograd.Function):
    """The C++ expert block for autograd: its forward keeps the routing and the two projections'
    outputs; its backward gives d hidden, d top_k_weights and the parameters' gradients."""

    @staticmethod
    def forward(ctx: Any, spec: Dict[str, Any], hidden: torch.Tensor, index: torch.Tensor,
                routing: torch.Tensor, first: torch.Tensor, first_bias: Optional[torch.Tensor],
                down: torch.Tensor, down_bias: Optional[torch.Tensor]) -> torch.Tensor:
        out, saved = _block_forward(spec, hidden, index, routing, first, first_bias, down,
                                    down_bias, True)
        ctx.spec = spec
        ctx.core_saved = saved
        ctx.save_for_backward(hidden, routing, first, first_bias, down, down_bias)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> Any:
        hidden, routing, first, first_bias, down, down_bias = ctx.saved_tensors
        spec = ctx.spec
        needs = ctx.needs_input_grad
        wanted = (bool(needs[1]), bool(needs[3]),
                  bool(needs[4] or needs[6]) and spec["weight_dtype"] is None,
                  bool(needs[5] or needs[7]))
        h_raw, h_kind = to_raw(hidden, "hidden_states")
        r_raw, r_kind = to_raw(routing, "top_k_weights")
        d_raw, _ = to_raw(d_out.to(hidden.dtype), "d_out")
        grads = _core.expert_block_backward(
            d_raw, h_raw, h_kind, r_raw, r_kind,
            _arrays(first, first_bias, down, down_bias, spec["first_scales"], spec["down_scales"]),
            spec["weight_dtype"], None, spec["transposed"], spec["gate"], ctx.core_saved, wanted,
            "torch")
        ctx.core_saved = None  # a second backward through the same graph is torch's error
        d_hidden, d_routing, d_first, d_first_bias, d_down, d_down_bias = grads
        return (None, d_hidden, None, d_routing, d_first if needs[4] else None,
                d_first_bias if needs[5] else None, d_down if needs[6] else None,
                d_down_bias if needs[7] else None)


def _weight(module: Any, name: str) -> torch.Tensor:
    """The module's stacked weight `name` as [N, out, in] (a view: copied by the Python path)."""
    w = getattr(module, name)
    return w.transpose(1, 2) if module.is_transposed else w


def _python_gate_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor) -> torch.Tensor:
    """GroupLin's grouped GEMM for both projections, the module's own gate and norm between and
    after them in Python, the combine in F32 (as transformers' grouped_mm)."""
    num_tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    experts = self.num_experts
    ids = top_k_index.reshape(-1)
    order = torch.sort(ids, stable=True).indices  # by expert, each expert's rows in token order
    counts = torch.bincount(ids.clamp(max=experts), minlength=experts + 1)[:experts]
    routed = int(counts.sum())  # sentinels (ids >= experts) sort last and are left out
    picked = order[:routed]
    m_splits = counts.tolist()

    first = "gate_up_proj" if self.has_gate else "up_proj"
    weight = _weight(self, first)
    x = hidden_states[picked // top_k].to(weight.dtype)
    h = grouped_linear(x, m_splits, weight, getattr(self, first + "_bias") if self.has_bias
                       else None)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    down = _weight(self, "down_proj")
    out = grouped_linear(h.to(down.dtype), m_splits, down,
                         self.down_proj_bias if self.has_bias else None)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    weighted = out.float() * top_k_weights.reshape(-1)[picked].float().unsqueeze(-1)
    slots = torch.zeros(num_tokens * top_k, hidden, dtype=torch.float32)
    slots = slots.index_copy(0, picked, weighted)
    return slots.view(num_tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


_FP8 = getattr(torch, "float8_e4m3fn", None)
_BLOCK = 128


def _fp8_scales(module: Any, name: str, weight: torch.Tensor) -> torch.Tensor:
    """The F32 128 x 128 block scales of the FP8 weight `name`, checked against its shape."""
    scales = getattr(module, name + "_scale_inv", None)
    experts, rows, cols = weight.shape
    want = (experts, -(-rows // _BLOCK), -(-cols // _BLOCK))
    block = getattr(module, "block_size", None)
    if (scales is None or scales.dtype != torch.float32 or tuple(scales.shape) != want
            or (block is not None and tuple(block) != (_BLOCK, _BLOCK))):
        found = ("none" if scales is None else f"{scales.dtype} {tuple(scales.shape)}") + (
            f", block_size {tuple(block)}" if block is not None else "")
        raise RuntimeError(f"grouplin experts of {type(module).__name__}: {name} is FP8 and "
                           f"needs F32 scales {name}_scale_inv of shape {want} (128 x 128 "
                           f"blocks); found {found}")
    return scales


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of one MoE layer for transformers' ``ExpertsInterface`` (and its FP8
    interface): hidden_states [T, H], top_k_index and top_k_weights [T, K]; returns [T, H] in
    hidden_states' dtype. FP8 weights (float8_e4m3fn codes beside ``<name>_scale_inv`` F32
    scales per 128 x 128 block) run as codes, never widened to a copy."""
    if hidden_states.device.type != "cpu":
        raise RuntimeError(f"grouplin experts of {type(self).__name__}: hidden_states are on "
                           f"{hidden_states.device}; GroupLin runs on CPU tensors")
    first_name = "gate_up_proj" if self.has_gate else "up_proj"
    first, down = getattr(self, first_name), self.down_proj
    fp8 = _FP8 is not None and first.dtype == _FP8
    gate = gate_of(self)
    if gate is None or self.has_post_expert_norm:
        if fp8:
            raise RuntimeError(f"grouplin experts of {type(self).__name__}: FP8 weights need a "
                               "gate GroupLin runs in C++ and no post-expert norm")
        _say_once(self, "a post-expert norm" if gate is not None else
                  "its gate is none GroupLin runs in C++")
        return _python_gate_forward(self, hidden_states, top_k_index, top_k_weights)
    first_bias = getattr(self, first_name + "_bias") if self.has_bias else None
    down_bias = self.down_proj_bias if self.has_bias else None
    spec = {"gate": gate, "transposed": bool(self.is_transposed), "weight_dtype": None,
            "first_scales": None, "down_scales": None}
    if fp8:
        spec.update(weight_dtype="F8_E4M3", first_scales=_fp8_scales(self, first_name, first),
                    down_scales=_fp8_scales(self, "down_proj", down))
        hidden = hidden_states if hidden_states.dtype in (torch.float32, torch.bfloat16) \
            else hidden_states.to(torch.bfloat16)
    else:
        hidden = hidden_states.to(first.dtype)
    routing = top_k_weights
    if routing.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        routing = routing.float()
    tensors = (hidden, routing, first, first_bias, down, down_bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        out = _ExpertBlockFunction.apply(spec, hidden, top_k_index, routing, first, first_bias,
                                         down, down_bias)
    else:
        out, _ = _block_forward(spec, hidden, top_k_index, routing, first, first_bias, down,
                                down_bias, False)
    return out.to(hidden_states.dtype)


def _experts_modules(model: Any):
    for prefix, module in model.named_modules():
        if hasattr(module, "has_gate") and hasattr(module, "_apply_gate") and \
                hasattr(module, "down_proj"):
            yield prefix, module


def _fp8_pair(checkpoint: Any, prefix: str, module: Any, name: str):
    """Codes [E, out, in] and scales of the module's projection `name` ("gate_up_proj",
    "up_proj" or "down_proj") from the checkpoint: fused (``<prefix>.<name>`` and
    ``<name>_scale_inv``) or per expert (``<prefix>.<e>.gate_proj.weight`` and its
    ``weight_scale_inv``, ...; gate and up stacked into one gate_up)."""
    fused = f"{prefix}.{name}"
    if fused in checkpoint and fused + "_scale_inv" in checkpoint:
        return checkpoint[fused], checkpoint[fused + "_scale_inv"]
    parts = {"gate_up_proj": ("gate_proj", "up_proj")}.get(name, (name,))
    codes, scales = [], []
    for e in range(module.num_experts):
        names = [f"{prefix}.{e}.{part}.weight" for part in parts]
        missing = [n for n in names + [n + "_scale_inv" for n in names] if n not in checkpoint]
        if missing:
            raise ValueError(f"grouplin.transformers.use_fp8_experts: {prefix} "
                             f"({type(module).__name__}): the checkpoint has neither {fused} "
                             f"with {fused}_scale_inv nor {missing[0]}")
        if len(parts) == 2:
            rows = checkpoint[names[0]].shape[0]
            if rows % _BLOCK:
                raise ValueError(f"grouplin.transformers.use_fp8_experts: {prefix}: gate_proj has "
                                 f"{rows} rows, not a multiple of {_BLOCK}: a 128 x 128 scale "
                                 "block would span gate and up rows; run these experts as "
                                 "dequantized values instead")
        codes.append(torch.cat([checkpoint[n] for n in names]))
        scales.append(torch.cat([checkpoint[n + "_scale_inv"] for n in names]))
    return torch.stack(codes), torch.stack(scales)


def use_fp8_experts(model: Any, checkpoint: Any) -> int:
    """Replaces the expert weights of every experts module of ``model`` by the FP8 codes and
    128 x 128 F32 scales of ``checkpoint`` (a path GroupLin reads: a file or a directory of
    shards, Hub per-expert names or transformers' fused ones): the experts then run as FP8 in
    GroupLin's expert block (no BF16 copy kept), for inference (FP8 weights take no gradient).
    transformers dequantizes a fine-grained FP8 model to BF16 on a CPU; this keeps its experts'
    bytes at the FP8 size. Returns the number of modules changed; raises ValueError naming the
    module and the tensor when the checkpoint lacks one, or its shape differs."""
    if _FP8 is None:
        raise RuntimeError("grouplin.transformers.use_fp8_experts needs torch with float8_e4m3fn")
    from .torch import load
    tensors = load(checkpoint)
    changed = 0
    for prefix, module in _experts_modules(model):
        if module.is_transposed:
            raise ValueError(f"grouplin.transformers.use_fp8_experts: {prefix}: FP8 experts "
                             "stored transposed are not supported")
        for name in ("gate_up_proj" if module.has_gate else "up_proj", "down_proj"):
            codes, scales = _fp8_pair(tensors, prefix, module, name)
            current = getattr(module, name)
            if codes.dtype != _FP8 or tuple(codes.shape) != tuple(current.shape):
                raise ValueError(f"grouplin.transformers.use_fp8_experts: {prefix}.{name}: the "
                                 f"checkpoint's is {codes.dtype} {tuple(codes.shape)}, expected "
                                 f"float8_e4m3fn {tuple(current.shape)}")
            delattr(module, name)
            module.register_buffer(name, codes.contiguous())
            module.register_buffer(name + "_scale_inv", scales.float().contiguous())
            _fp8_scales(module, name, codes)
        changed += 1
    if changed == 0:
        raise ValueError("grouplin.transformers.use_fp8_experts: the model has no experts module "
                         "that transformers decorates")
    return changed


def register() -> str:
    """Registers ``experts_forward`` under the name "grouplin" in transformers'
    ``ExpertsInterface`` and, where transformers has it, its ``FP8ExpertsInterface``;
    idempotent. Returns the name."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(NAME, experts_forward)
    try:
        from transformers.integrations.finegrained_fp8 import FP8ExpertsInterface
    except ImportError:  # a transformers without FP8 experts
        return NAME
    FP8ExpertsInterface.register(NAME, experts_forward)
    return NAME


register()
