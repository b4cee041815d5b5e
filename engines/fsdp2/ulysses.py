"""Ulysses sequence parallel for transformers models (the scheme verl's FSDP backend uses).

Each rank holds a contiguous slice of the sequence. Around core attention an all-to-all trades the
sequence split for a head split, so attention sees the whole sequence for a subset of heads; a second
all-to-all trades back. RoPE and norms run on the local slice with its global position ids.
Registered as the transformers attention implementation "parity_ulysses". Packed rows (one stream of
concatenated sequences) get the whole stream's position ids instead of a padding mask: the sequences are found
from them as transformers finds them (`find_packed_sequence_indices`), as verl's Ulysses path derives its
flash-attention cu_seqlens from the position ids.

No module-global state: the engine that owns the Ulysses group hands it, with the batch's whole-sequence padding
or packed positions, to every forward as the model keyword `ulysses` (transformers passes a model's extra keywords
down to the attention function), so two engines in one process never share a group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

ATTN_NAME = "parity_ulysses"


#: the model keyword that carries a forward's UlyssesState down to the attention function
KWARG = "ulysses"


@dataclass(frozen=True, slots=True)
class UlyssesState:
    """One forward's Ulysses context: the engine's group and what this batch's attention needs of the whole
    sequence."""

    group: Any
    key_padding: torch.Tensor | None = None
    """[B, S] bool, True for real tokens of the WHOLE sequence of this rank's rows (padded rows)."""
    positions: torch.Tensor | None = None
    """[1, T] position ids of the WHOLE packed stream (packed rows; None for padded ones)."""


class _AllToAll(torch.autograd.Function):
    """Split `scatter_dim` over the group, concatenate received chunks along `gather_dim`."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        size = dist.get_world_size(group)
        inputs = [t.contiguous() for t in tensor.chunk(size, dim=scatter_dim)]
        outputs = [torch.empty_like(inputs[0]) for _ in range(size)]
        dist.all_to_all(outputs, inputs, group=group)
        return torch.cat(outputs, dim=gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _AllToAll.apply(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      ulysses: UlyssesState | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query/key/value [B, H, L_local, D] -> output [B, L_local, H, D] (transformers' convention).
    The mask transformers built for the local slice is ignored: the whole-sequence mask comes from `ulysses`."""
    if ulysses is None:
        raise RuntimeError(f"{ATTN_NAME} attention needs the forward's UlyssesState: call the model with "
                           f"{KWARG}=UlyssesState(group, ...)")
    group = ulysses.group
    q = _AllToAll.apply(query, group, 1, 2)
    k = _AllToAll.apply(key, group, 1, 2)
    v = _AllToAll.apply(value, group, 1, 2)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    seq = q.shape[2]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    if ulysses.positions is not None:
        allowed = causal[None] & same_sequence(ulysses.positions.to(q.device))
    else:
        allowed = causal[None] & ulysses.key_padding[:, None, :].to(q.device)
    allowed |= torch.eye(seq, dtype=torch.bool, device=q.device)[None]  # fully padded rows stay finite
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], dropout_p=dropout, scale=scaling)
    out = _AllToAll.apply(out, group, 2, 1)
    return out.transpose(1, 2).contiguous(), None


def same_sequence(positions: torch.Tensor) -> torch.Tensor:
    """[B, T] packed position ids -> [B, T, T] True where two tokens belong to one sequence."""
    from transformers.masking_utils import find_packed_sequence_indices

    sequence = find_packed_sequence_indices(positions)
    if sequence is None:  # one sequence per row
        sequence = torch.zeros_like(positions)
    return sequence[:, :, None] == sequence[:, None, :]


def register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTN_NAME, ulysses_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
