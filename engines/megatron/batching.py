"""The workload batch cut into this rank's Megatron micro-batches, and per-token results put back together.

Rows are split over data parallelism, then into micro-batches of `micro_batch_size` rows; padded, the sequence is
split over CP by the engine's `cp_split` (Megatron's own `get_batch_on_this_cp_rank`: chunks r and 2cp-1-r; a
framework with its own CP attention splits as that attention expects); packed, each micro-batch is one THD stream
split per sequence (engines/megatron/packing.py). Everything the loss needs is
aligned with the logits that produce it: position i scores token i+1, so the response values sit at positions
P-1 .. S-2 (as engines/fsdp2/engine.py does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from parity.engines.megatron.packing import THDSplit, pack_micro_batch, packed_seq_params
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.workload import Batch, next_token_labels, per_position


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One micro-batch as this rank sees it: sequence tensors are CP-local except a padded row's position_ids."""

    tokens: torch.Tensor
    """[b, s_local] input ids (packed: [1, t_local], this rank's THD share)."""
    position_ids: torch.Tensor
    """Padded: [b, s] WHOLE sequence, the model slices the RoPE angles per CP rank itself. Packed: [1, t_local]
    position inside each sequence (Megatron's THD RoPE reads cu_seqlens, not these)."""
    attention_mask: torch.Tensor | list[torch.Tensor] | None
    """bool, True = masked out: causal AND key is a real token (HF's mask); [b, 1, s_local, s] from Megatron's
    split, or whatever form the engine's `cp_split` gives its CP attention. None when packed (THD)."""
    labels: torch.Tensor
    """[b, s_local] the token each position scores (the next one)."""
    score_mask: torch.Tensor
    """[b, s_local] 1 where a real response token is scored."""
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    row: torch.Tensor
    """[b, s_local] global batch row of each local token; -1 for the alignment padding of a packed stream."""
    col: torch.Tensor
    """[b, s_local] its column in the padded [B, S] batch."""
    padding: torch.Tensor | None = None
    """[b, s_local] bool, True where the token is padding (a padded row's left / right padding, a packed
    stream's alignment tokens): what Megatron's MoE routers must leave out of their load statistics."""
    packed_seq_params: Any = None
    """Megatron's PackedSeqParams (qkv_format 'thd') of a packed micro-batch; None when padded."""

    @property
    def real(self) -> torch.Tensor:
        return self.row >= 0


def attention_mask(real: torch.Tensor) -> torch.Tensor:
    """[b, s] real-token mask -> [b, 1, s, s] bool, True where query i may NOT attend key j.

    A left-pad query before a row's first real token has no key it may attend: it attends to itself instead, as
    transformers does for SDPA (`AttentionMaskConverter._unmask_unattended`). It is never scored and no real
    query attends a pad key, so no scored number moves; a fully masked row is one whose fused-attention output the
    torch_npu op reference leaves undocumented (docs/ascend.md, the emulated ops against the op reference)."""
    seq = real.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    allowed = causal[None] & real.bool()[:, None, :]
    unattended = ~allowed.any(dim=-1, keepdim=True) & torch.eye(seq, dtype=torch.bool)[None]
    return ~(allowed | unattended)[:, None]


#: a CP split: whole [b, s] tensors (and the [b, 1, s, s] mask under 'attention_mask') -> this CP rank's share
CPSplit = Callable[[dict[str, torch.Tensor]], dict[str, Any]]


def micro_batches(batch: Batch, old_logprobs: torch.Tensor | None, dp: int, dp_rank: int, micro_batch_size: int,
                  device: torch.device, cp_split: CPSplit | None = None) -> list[MicroBatch]:
    """This rank's micro-batches (old_logprobs None for a forward-only pass); `cp_split` defaults to Megatron's
    `get_batch_on_this_cp_rank`. The split's 'positions' say which global positions this rank holds."""
    if cp_split is None:
        from megatron.core.utils import get_batch_on_this_cp_rank as cp_split

    seq = batch.input_ids.shape[1]
    labels, score_mask, old, advantages = aligned_values(batch, old_logprobs)
    out = []
    for rows in _micro_batch_rows(batch, dp, dp_rank, micro_batch_size):
        # on the device BEFORE slicing: up to 0.12 Megatron moves its chunk index to the accelerator (`.cuda()`)
        whole = {
            "tokens": batch.input_ids[rows], "labels": labels[rows], "score_mask": score_mask[rows],
            "old_logprobs": old[rows], "advantages": advantages[rows],
            "positions": torch.arange(seq)[None].expand(len(rows), seq).contiguous(),
            "attention_mask": attention_mask(batch.attention_mask[rows]),
            "padding": batch.attention_mask[rows] == 0,
        }
        sliced = cp_split({key: value.to(device) for key, value in whole.items()})
        cols = sliced["positions"].cpu()
        out.append(MicroBatch(
            tokens=sliced["tokens"], position_ids=batch.position_ids[rows].to(device),
            attention_mask=sliced["attention_mask"], labels=sliced["labels"], score_mask=sliced["score_mask"],
            old_logprobs=sliced["old_logprobs"], advantages=sliced["advantages"],
            row=rows[:, None].expand(cols.shape).contiguous(), col=cols, padding=sliced["padding"]))
    return out


def packed_micro_batches(batch: Batch, old_logprobs: torch.Tensor | None, dp: int, dp_rank: int,
                         micro_batch_size: int, device: torch.device, align: int, split: THDSplit,
                         faults: FaultPlan) -> list[MicroBatch]:
    """This rank's micro-batches as packed THD streams (engines/megatron/packing.py): each micro-batch's rows
    without padding, each sequence padded to a multiple of `align`, this CP rank's share by `split`."""
    labels, score_mask, old, advantages = aligned_values(batch, old_logprobs)
    values = {"tokens": batch.input_ids, "labels": labels, "score_mask": score_mask, "old_logprobs": old,
              "advantages": advantages}
    out = []
    for rows in _micro_batch_rows(batch, dp, dp_rank, micro_batch_size):
        whole, cu_padded = pack_micro_batch(batch, rows, align, values)
        sliced = split({key: value.to(device) for key, value in whole.items()}, cu_padded)
        out.append(MicroBatch(
            tokens=sliced["tokens"], position_ids=sliced["positions"], attention_mask=None, labels=sliced["labels"],
            score_mask=sliced["score_mask"], old_logprobs=sliced["old_logprobs"], advantages=sliced["advantages"],
            row=sliced["row"].cpu(), col=sliced["col"].cpu(), padding=sliced["row"] < 0,
            packed_seq_params=packed_seq_params(cu_padded, device, faults)))
    return out


def _micro_batch_rows(batch: Batch, dp: int, dp_rank: int, micro_batch_size: int) -> list[torch.Tensor]:
    rows_per_rank = batch.input_ids.shape[0] // dp
    if rows_per_rank % micro_batch_size:
        raise ValueError(f"micro_batch_size({micro_batch_size}) must divide the {rows_per_rank} rows per "
                         "data-parallel rank")
    return [torch.arange(first, first + micro_batch_size)
            for first in range(dp_rank * rows_per_rank, (dp_rank + 1) * rows_per_rank, micro_batch_size)]


def aligned_values(batch: Batch, old_logprobs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """[B, S] labels, score mask, old log-probs (zeros for a forward-only pass) and advantages, each aligned with
    the logits position that scores it."""
    old = per_position(batch, old_logprobs.float().cpu() if old_logprobs is not None
                       else torch.zeros(batch.response_mask.shape))
    return (next_token_labels(batch), per_position(batch, batch.response_mask.float()), old,
            per_position(batch, batch.advantages.float()))


def assemble(shape: tuple[int, int], pieces: list[tuple[MicroBatch, torch.Tensor]], owner: bool,
             device: torch.device) -> torch.Tensor:
    """Whole [B, S] tensor on every rank from each rank's (micro-batch, [b, s_local] values) pieces.

    Every (row, position) belongs to exactly one owner rank (one TP rank of the last pipeline stage per
    dp x cp coordinate), so a SUM all-reduce of zero-filled tensors reassembles it exactly; a packed stream's
    alignment padding belongs to no row and is dropped."""
    full = torch.zeros(shape, dtype=torch.float32)
    if owner:
        for micro, values in pieces:
            real = micro.real
            full[micro.row[real], micro.col[real]] = values.detach().float().cpu()[real]
    full = full.to(device)
    dist.all_reduce(full)
    return full.cpu()
