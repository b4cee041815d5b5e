"""Context-parallel core attention for CPU runs, where Megatron's local `DotProductAttention` refuses CP and
Transformer Engine's ring attention is unavailable.

Each CP rank holds two of the 2*cp sequence chunks (rank r: chunks r and 2cp-1-r, Megatron's load balancing).
This module all-gathers K and V over the CP group, puts the chunks back in sequence order and attends the local
queries to the whole sequence under the mask the engine built for exactly those query positions (causal +
padding, True = masked out). The backward of the gather all-reduces the K/V gradients and keeps the local
chunks. It exercises Megatron's CP plumbing around attention (batch slicing, per-rank RoPE slices, DDP over
dp x cp, loss and grad scaling) but NOT TE's ring-exchange kernels or their online-softmax merging.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.transformer.module import MegatronModule

from parity.engines.megatron import compat


class _GatherChunks(torch.autograd.Function):
    """All-gather along dim 0 over the CP group; backward sums the gradient over the group and keeps this
    rank's part (a reduce-scatter, written as all-reduce + slice because gloo has no unequal reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(tensor) for _ in range(group.size())]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.group.size())[ctx.group.rank()].contiguous(), None


def sequence_order(cp: int) -> list[int]:
    """Chunk ids in all-gather order ([0, 2cp-1, 1, 2cp-2, ...]): where each chunk of the sequence lands."""
    return [c for r in range(cp) for c in (r, 2 * cp - 1 - r)]


class CPGatherAttention(MegatronModule):
    """Drop-in for `core_attention` in the layer spec (same constructor and forward signature; the process
    groups come as `model_comm_pgs` in 0.13 / 0.14, `pg_collection` from 0.15, not at all in 0.12)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None, model_comm_pgs: Any = None) -> None:
        super().__init__(config=config)
        from megatron.core import parallel_state

        self.cp_group = compat.cp_group_of(pg_collection, model_comm_pgs)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.groups = max(config.num_query_groups // tp, 1)
        self.head_dim = config.kv_channels
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        if (attention_dropout if attention_dropout is not None else config.attention_dropout) > 0:
            raise ValueError("CPGatherAttention has no dropout: set attention_dropout to 0")

    def _whole_sequence(self, local: torch.Tensor) -> torch.Tensor:
        """[s_local, ...] -> [s, ...] in sequence order."""
        cp = self.cp_group.size()
        chunks = _GatherChunks.apply(local, self.cp_group).chunk(2 * cp)
        placed = dict(zip(sequence_order(cp), chunks, strict=True))
        return torch.cat([placed[c] for c in range(2 * cp)])

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None, attention_bias: Any = None,
                packed_seq_params: Any = None) -> torch.Tensor:
        if attention_mask is None or packed_seq_params is not None or attention_bias is not None:
            raise ValueError("CPGatherAttention needs an explicit [b, 1, s_local, s] mask and no packing or bias")
        key, value = self._whole_sequence(key), self._whole_sequence(value)
        if self.heads > self.groups:
            key = key.repeat_interleave(self.heads // self.groups, dim=2)
            value = value.repeat_interleave(self.heads // self.groups, dim=2)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        scores = scores.masked_fill(attention_mask, -10000.0)
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        context = torch.matmul(probs, v)  # [b, n, s_local, d]
        s_local, batch = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(s_local, batch, self.heads * self.head_dim)
