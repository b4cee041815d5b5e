"""The workload batch cut into this rank's Megatron micro-batches, and per-token results put back together.

Rows are split over data parallelism, then into micro-batches of `micro_batch_size` rows; the sequence is split
over CP by the engine's `cp_split` (Megatron's own `get_batch_on_this_cp_rank`: chunks r and 2cp-1-r; a
framework with its own CP attention splits as that attention expects). Everything the loss needs is
aligned with the logits that produce it: position i scores token i+1, so the response values sit at positions
P-1 .. S-2 (as engines/fsdp2.py does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from parity.harness.contract.workload import Batch


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One micro-batch as this rank sees it: sequence tensors are CP-local except position_ids."""

    tokens: torch.Tensor
    """[b, s_local] input ids."""
    position_ids: torch.Tensor
    """[b, s] WHOLE sequence: the model slices the RoPE angles per CP rank itself."""
    attention_mask: torch.Tensor | list[torch.Tensor]
    """bool, True = masked out: causal AND key is a real token (HF's mask); [b, 1, s_local, s] from Megatron's
    split, or whatever form the engine's `cp_split` gives its CP attention."""
    labels: torch.Tensor
    """[b, s_local] the token each position scores (the next one)."""
    score_mask: torch.Tensor
    """[b, s_local] 1 where a real response token is scored."""
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    rows: torch.Tensor
    """[b] global row index of each row."""
    positions: torch.Tensor
    """[s_local] global position of each local column."""


def attention_mask(real: torch.Tensor) -> torch.Tensor:
    """[b, s] real-token mask -> [b, 1, s, s] bool, True where query i may NOT attend key j."""
    seq = real.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    allowed = causal[None] & real.bool()[:, None, :]
    return ~allowed[:, None]


def per_position(batch: Batch, values: torch.Tensor) -> torch.Tensor:
    """[B, R] response-aligned values -> [B, S] aligned with the logits that score them."""
    out = torch.zeros(batch.input_ids.shape, dtype=values.dtype)
    out[:, batch.prompt_len - 1:-1] = values
    return out


#: a CP split: whole [b, s] tensors (and the [b, 1, s, s] mask under 'attention_mask') -> this CP rank's share
CPSplit = Callable[[dict[str, torch.Tensor]], dict[str, Any]]


def micro_batches(batch: Batch, old_logprobs: torch.Tensor | None, dp: int, dp_rank: int, micro_batch_size: int,
                  device: torch.device, cp_split: CPSplit | None = None) -> list[MicroBatch]:
    """This rank's micro-batches (old_logprobs None for a forward-only pass); `cp_split` defaults to Megatron's
    `get_batch_on_this_cp_rank`. The split's 'positions' say which global positions this rank holds."""
    if cp_split is None:
        from megatron.core.utils import get_batch_on_this_cp_rank as cp_split

    rows_per_rank = batch.input_ids.shape[0] // dp
    if rows_per_rank % micro_batch_size:
        raise ValueError(f"micro_batch_size({micro_batch_size}) must divide the {rows_per_rank} rows per "
                         "data-parallel rank")
    seq = batch.input_ids.shape[1]
    labels = torch.cat([batch.input_ids[:, 1:], torch.zeros_like(batch.input_ids[:, :1])], dim=1)
    old = per_position(batch, old_logprobs.float().cpu() if old_logprobs is not None
                       else torch.zeros(batch.response_mask.shape))
    score_mask = per_position(batch, batch.response_mask.float())
    advantages = per_position(batch, batch.advantages.float())
    out = []
    for first in range(dp_rank * rows_per_rank, (dp_rank + 1) * rows_per_rank, micro_batch_size):
        rows = torch.arange(first, first + micro_batch_size)
        # on the device BEFORE slicing: up to 0.12 Megatron moves its chunk index to the accelerator (`.cuda()`)
        whole = {
            "tokens": batch.input_ids[rows], "labels": labels[rows], "score_mask": score_mask[rows],
            "old_logprobs": old[rows], "advantages": advantages[rows],
            "positions": torch.arange(seq)[None].expand(len(rows), seq).contiguous(),
            "attention_mask": attention_mask(batch.attention_mask[rows]),
        }
        sliced = cp_split({key: value.to(device) for key, value in whole.items()})
        out.append(MicroBatch(
            tokens=sliced["tokens"], position_ids=batch.position_ids[rows].to(device),
            attention_mask=sliced["attention_mask"], labels=sliced["labels"], score_mask=sliced["score_mask"],
            old_logprobs=sliced["old_logprobs"], advantages=sliced["advantages"], rows=rows,
            positions=sliced["positions"][0].cpu()))
    return out


def assemble(shape: tuple[int, int], pieces: list[tuple[MicroBatch, torch.Tensor]], owner: bool,
             device: torch.device) -> torch.Tensor:
    """Whole [B, S] tensor on every rank from each rank's (micro-batch, [b, s_local] values) pieces.

    Every (row, position) belongs to exactly one owner rank (one TP rank of the last pipeline stage per
    dp x cp coordinate), so a SUM all-reduce of zero-filled tensors reassembles it exactly."""
    full = torch.zeros(shape, dtype=torch.float32)
    if owner:
        for micro, values in pieces:
            full[micro.rows[:, None], micro.positions[None, :]] = values.detach().float().cpu()
    full = full.to(device)
    dist.all_reduce(full)
    return full.cpu()
