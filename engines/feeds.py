"""What a transformers-based engine feeds its model: this rank's rows of the global batch, padded or packed.

Padded (the HF-style path): [b, S] rows with their attention mask, cut into contiguous sequence slices under
Ulysses. Packed (verl's `use_remove_padding`): the rows' real tokens concatenated into one [1, T] stream with no
attention mask and position ids restarting at 0 per sequence, from which transformers finds the sequence
boundaries itself (`masking_utils.find_packed_sequence_indices`: a new sequence wherever the position does not
grow by one) and builds a block-diagonal causal mask for sdpa / eager. Under Ulysses the stream is padded to a
multiple of sp with tokens whose positions count 0, 1, ... (verl's `ulysses_pad`: a sequence of their own) and
each rank takes a contiguous slice.

Every fed token knows its (row, column) in the padded [B, S] batch, so per-position values (labels, loss mask,
old log-probs, advantages) are gathered from the padded batch and results scattered back the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.workload import Batch, next_token_labels, pack_rows


@dataclass(frozen=True, slots=True)
class Feed:
    tokens: torch.Tensor
    """[b, s] input ids this rank feeds."""
    positions: torch.Tensor
    """[b, s] their position ids."""
    attention_mask: torch.Tensor | None
    """[b, s] 1 = real token (padded feed without Ulysses); None: packed, the model finds the sequences."""
    row: torch.Tensor
    """[b, s] the batch row of each fed token (0 where `real` is False)."""
    col: torch.Tensor
    """[b, s] its column in the padded batch."""
    real: torch.Tensor
    """[b, s] bool: the token is one of the batch's (not alignment padding added by the feed)."""
    labels: torch.Tensor
    """[b, s] the token each position scores."""
    key_padding: torch.Tensor | None = None
    """Ulysses, padded: [b, S] bool, True for real tokens of the WHOLE rows (attention sees the whole sequence)."""
    stream_positions: torch.Tensor | None = None
    """Ulysses, packed: [1, T] position ids of the WHOLE stream (attention finds the sequences from them)."""

    def take(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, S] values aligned with the padded batch -> [b, s] aligned with this feed (0 on alignment pads)."""
        return torch.where(self.real, padded[self.row, self.col], torch.zeros((), dtype=padded.dtype))


def padded_feed(batch: Batch, rows: torch.Tensor, sp: int = 1, sp_rank: int = 0) -> Feed:
    """`rows` as they are; under Ulysses the contiguous sequence slice `sp_rank` of sp."""
    seq = batch.input_ids.shape[1]
    cols = slice(sp_rank * (seq // sp), (sp_rank + 1) * (seq // sp))
    grid_rows = rows[:, None].expand(len(rows), seq)
    grid_cols = torch.arange(seq)[None].expand(len(rows), seq)
    mask = batch.attention_mask[rows]
    return Feed(tokens=batch.input_ids[rows][:, cols], positions=batch.position_ids[rows][:, cols],
                attention_mask=mask, row=grid_rows[:, cols], col=grid_cols[:, cols],
                real=torch.ones(len(rows), cols.stop - cols.start, dtype=torch.bool),
                labels=next_token_labels(batch)[rows][:, cols],
                key_padding=mask.bool() if sp > 1 else None)


def packed_feed(batch: Batch, rows: torch.Tensor, sp: int = 1, sp_rank: int = 0,
                faults: FaultPlan | None = None) -> Feed:
    """`rows` packed into one stream, padded to a multiple of sp, slice `sp_rank` of it.

    Fault `packed_position_ids_continue`: the stream's position ids count on across sequence boundaries (0..T-1,
    as a packer that forgot to restart them would give): transformers then sees ONE sequence."""
    packed = pack_rows(batch, rows)
    total = packed.input_ids.shape[0]
    positions = packed.position_ids
    if faults is not None and faults.active("packed_position_ids_continue"):
        positions = torch.arange(total)
    pad = (-total) % sp
    tokens = torch.cat([packed.input_ids, torch.zeros(pad, dtype=packed.input_ids.dtype)])
    positions = torch.cat([positions, torch.arange(pad)])
    row = torch.cat([packed.row, torch.zeros(pad, dtype=torch.long)])
    col = torch.cat([packed.col, torch.zeros(pad, dtype=torch.long)])
    real = torch.cat([torch.ones(total, dtype=torch.bool), torch.zeros(pad, dtype=torch.bool)])
    labels = torch.where(real, next_token_labels(batch)[row, col], torch.zeros((), dtype=tokens.dtype))
    width = (total + pad) // sp
    part = slice(sp_rank * width, (sp_rank + 1) * width)
    return Feed(tokens=tokens[None, part], positions=positions[None, part], attention_mask=None,
                row=row[None, part], col=col[None, part], real=real[None, part], labels=labels[None, part],
                stream_positions=positions[None] if sp > 1 else None)


def unpack(batch: Batch, feed: Feed, values: torch.Tensor) -> torch.Tensor:
    """[b, s] (or [s]) results of a one-process feed -> [B, S] aligned with the padded batch, 0 elsewhere;
    differentiable (the hf engine trains through it)."""
    flat, real = values.reshape(-1), feed.real.reshape(-1).to(values.device)
    index = (feed.row.reshape(-1) * batch.input_ids.shape[1] + feed.col.reshape(-1)).to(values.device)
    full = torch.zeros(batch.input_ids.numel(), dtype=values.dtype, device=values.device)
    return full.index_put((index[real],), flat[real]).reshape(batch.input_ids.shape)
