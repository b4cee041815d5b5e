"""Core attention for CPU runs where Megatron's local `DotProductAttention` cannot run — context parallelism
(it asserts cp == 1) and packed THD sequences (it refuses `packed_seq_params`) — and Transformer Engine, which
takes both, is unavailable.

`CPGatherAttention` (padded rows, cp > 1):

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
from parity.engines.megatron.packing import thd_partitioned_indices


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


class THDAttention(CPGatherAttention):
    """Core attention for packed THD micro-batches (any cp), in place of TE's `DotProductAttention` with
    qkv_format 'thd': query / key / value [t_local, heads, d], `packed_seq_params.cu_seqlens_*_padded` the
    sequence boundaries of the whole stream, `cu_seqlens_*` how many leading tokens of each are real (verl gives
    both the padded boundaries). Under CP the local tokens are TE's partition of each sequence (chunks r and
    2cp-1-r, `packing.thd_partitioned_indices`): K and V are all-gathered over the CP group and put back in stream
    order, and each local query attends, causally, to the real keys of its own sequence."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None, attention_bias: Any = None,
                packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is None or getattr(packed_seq_params, "qkv_format", None) != "thd":
            raise ValueError("THDAttention takes packed THD micro-batches only (packed_seq_params, qkv_format thd)")
        if attention_mask is not None or attention_bias is not None:
            raise ValueError("THDAttention takes no attention mask or bias: cu_seqlens say where sequences are")
        if query.dim() == 4:  # [t, 1, n, d] where a release does not squeeze the dummy batch dimension
            query, key, value = (t.squeeze(1) for t in (query, key, value))
        bounds = packed_seq_params.cu_seqlens_q_padded
        bounds = (packed_seq_params.cu_seqlens_q if bounds is None else bounds).long().cpu()
        real = (packed_seq_params.cu_seqlens_q[1:] - packed_seq_params.cu_seqlens_q[:-1]).long().cpu()
        cp, rank = self.cp_group.size(), self.cp_group.rank()
        held = [thd_partitioned_indices(bounds, cp, r) for r in range(cp)]
        if cp > 1:
            order = torch.cat(held).argsort().to(key.device)
            key = _GatherChunks.apply(key, self.cp_group).index_select(0, order)
            value = _GatherChunks.apply(value, self.cp_group).index_select(0, order)
        queries, keys = held[rank], torch.arange(int(bounds[-1]))
        seq_q = torch.bucketize(queries, bounds[1:], right=True)
        seq_k = torch.bucketize(keys, bounds[1:], right=True)
        allowed = ((seq_q[:, None] == seq_k[None, :]) & (keys[None, :] <= queries[:, None])
                   & ((keys - bounds[seq_k]) < real[seq_k])[None, :])
        allowed |= keys[None, :] == queries[:, None]  # a padding query attends at least to itself
        if self.heads > self.groups:
            key = key.repeat_interleave(self.heads // self.groups, dim=1)
            value = value.repeat_interleave(self.heads // self.groups, dim=1)
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [n, t, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        context = torch.matmul(probs, v)  # [n, t_local, d]
        return context.transpose(0, 1).reshape(query.shape[0], self.heads * self.head_dim)
