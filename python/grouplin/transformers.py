"""GroupLin as an experts backend of transformers (5.x): the experts of every MoE model whose
experts class transformers decorates with ``use_experts_implementation`` run on GroupLin's
grouped GEMM.

    import grouplin.transformers                     # registers the backend "grouplin"
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="grouplin")
    model.set_experts_implementation("grouplin")     # or switch a loaded model over

What runs where: tokens are routed by a stable sort of their expert ids (ids >= num_experts,
expert parallelism's sentinels, give zero rows); the gate/up and down projections are GroupLin's
stateless grouped GEMM (``grouplin.torch.grouped_linear``: forward and backward, F32 or BF16);
between them the module's own ``_apply_gate`` (or ``act_fn`` without a gate) and
``post_expert_norm`` run as transformers defines them, so every family's gate is its own; the
weighted combine sums each token's experts in F32, as transformers' grouped_mm does. The
module's parameters are read in place, never copied, except weights stored transposed
(``is_transposed``: gpt-oss), which are made [N, out, in] for each call. CPU tensors only.
"""

from __future__ import annotations

from typing import Any

import torch

from .torch import grouped_linear

__all__ = ["NAME", "register", "experts_forward"]

NAME = "grouplin"


def _weight(module: Any, name: str) -> torch.Tensor:
    """The module's stacked weight `name` as [N, out, in]."""
    w = getattr(module, name)
    return w.transpose(1, 2) if module.is_transposed else w


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of one MoE layer for transformers' ``ExpertsInterface``: hidden_states
    [T, H], top_k_index and top_k_weights [T, K]; returns [T, H] in hidden_states' dtype."""
    if hidden_states.device.type != "cpu":
        raise RuntimeError(f"grouplin experts of {type(self).__name__}: hidden_states are on "
                           f"{hidden_states.device}; GroupLin runs on CPU tensors")
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

    # Each token's experts summed in F32, in the order of its top-k slots.
    weighted = out.float() * top_k_weights.reshape(-1)[picked].float().unsqueeze(-1)
    slots = torch.zeros(num_tokens * top_k, hidden, dtype=torch.float32)
    slots = slots.index_copy(0, picked, weighted)
    return slots.view(num_tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def register() -> str:
    """Registers ``experts_forward`` under the name "grouplin" in transformers'
    ``ExpertsInterface``; idempotent. Returns the name."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(NAME, experts_forward)
    return NAME


register()
