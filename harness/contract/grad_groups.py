"""Per-module gradient fingerprint: parameters grouped by module in HF naming, so that a reference and any engine
(whatever it calls its parameters, however it fuses them) report comparable pre-clip grad norms per group.

Groups: `embed_tokens`, `norm`, `lm_head`, and per layer i `layers.i.input_layernorm`, `layers.i.self_attn.qkv`
(q/k/v projections together: Megatron fuses them into one linear_qkv), `layers.i.self_attn.o_proj`,
`layers.i.self_attn.q_norm` / `k_norm`, `layers.i.post_attention_layernorm`, `layers.i.mlp.gate_up` (gate and up
together: Megatron's fc1), `layers.i.mlp.down_proj`, `layers.i.mlp.router`, `layers.i.mlp.experts` (every expert).
The root-sum-square of all group norms is the global grad norm.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import torch

_WRAPPERS = re.compile(r"(?:^|\.)(?:_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)(?=\.)")
_LAYER = r"^layers\.(\d+)\."
_MOE = r"(?:mlp|block_sparse_moe)"
#: (pattern on the HF parameter name without its `model.` prefix, group)
HF_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), g) for p, g in (
    (r"^embed_tokens\.", "embed_tokens"),
    (r"^norm\.", "norm"),
    (r"^lm_head\.", "lm_head"),
    (_LAYER + r"self_attn\.[qkv]_proj\.", r"layers.\1.self_attn.qkv"),
    (_LAYER + r"self_attn\.o_proj\.", r"layers.\1.self_attn.o_proj"),
    (_LAYER + r"self_attn\.(q_norm|k_norm)\.", r"layers.\1.self_attn.\2"),
    (_LAYER + r"(input_layernorm|post_attention_layernorm)\.", r"layers.\1.\2"),
    (_LAYER + _MOE + r"\.(?:gate_proj|up_proj)\.", r"layers.\1.mlp.gate_up"),
    (_LAYER + _MOE + r"\.down_proj\.", r"layers.\1.mlp.down_proj"),
    (_LAYER + _MOE + r"\.gate\.", r"layers.\1.mlp.router"),
    (_LAYER + _MOE + r"\.experts\.", r"layers.\1.mlp.experts"),
    (_LAYER + _MOE + r"\.shared_experts?\.", r"layers.\1.mlp.shared_experts"),
))


def hf_group(name: str) -> str:
    """The group of an HF parameter name (wrapper prefixes and `model.` dropped); an unknown name is its own
    group (its module path), so nothing is left out of the sum."""
    name = _WRAPPERS.sub("", name).lstrip(".")
    while name.startswith("model."):  # the HF prefix, and any wrapper's attribute named `model` (MindSpeed FSDP)
        name = name.removeprefix("model.")
    for pattern, group in HF_RULES:
        if match := pattern.match(name):
            return match.expand(group)
    return name.rsplit(".", 1)[0]


def describe(group: str) -> str:
    """`layers.2.self_attn.q_norm` -> `layer 2 self_attn.q_norm` (for FAIL reasons)."""
    match = re.match(r"^layers\.(\d+)\.(.+)$", group)
    return f"layer {match.group(1)} {match.group(2)}" if match else group


def add_squares(totals: dict[str, float], group: str, grad: torch.Tensor) -> None:
    """Accumulate one (local, plain) gradient's squared L2 norm into its group, in fp32 or wider."""
    norm = float(torch.linalg.vector_norm(grad.detach(), 2.0, dtype=torch.float32))
    totals[group] = totals.get(group, 0.0) + norm * norm


def norms(squares: Mapping[str, float]) -> dict[str, float]:
    """Squared sums -> norms, in a stable (sorted) order."""
    return {group: math.sqrt(value) for group, value in sorted(squares.items())}


def named_grad_norms(named_grads: Iterable[tuple[str, torch.Tensor | None]]) -> dict[str, float]:
    """Group norms of whole (unsharded) gradients named in HF naming (the single-process engines)."""
    squares: dict[str, float] = {}
    for name, grad in named_grads:
        if grad is not None:
            add_squares(squares, hf_group(name), grad)
    return norms(squares)
