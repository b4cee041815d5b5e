"""Packed (THD) micro-batches, as verl feeds Megatron with `use_remove_padding`.

Each micro-batch's rows lose their padding and are concatenated into one [1, T] stream; every sequence is padded
at its end to a multiple of `align` = tp·cp·2 (cp > 1) or tp (verl's `preprocess_packed_seqs`,
verl/models/mcore/util.py), so that each CP rank gets two equal chunks of it and each TP rank an equal share
under sequence parallelism. Megatron gets `PackedSeqParams(qkv_format="thd")` with those padded boundaries as
both `cu_seqlens_*` and `cu_seqlens_*_padded` (verl passes the same). Under CP each sequence is cut into 2·cp
chunks and rank r keeps chunks r and 2cp-1-r, in that order, sequence after sequence: Transformer Engine's
`thd_get_partitioned_indices` (transformer_engine/common/fused_attn/context_parallel.cu,
`thd_partition_indices_kernel`), which Megatron-Core's `get_thd_batch_on_this_cp_rank` (megatron/core/utils.py)
calls and its THD RoPE (`_get_thd_freqs_on_this_cp_rank`, models/common/embeddings/rope_utils.py) and TE's CP
attention assume. TE is not installed on CPU, so `thd_partitioned_indices` states the same index map here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.workload import Batch, pack_rows

#: a THD CP split: the whole micro-batch's [1, T] tensors and its padded cu_seqlens -> this CP rank's share
THDSplit = Callable[[dict[str, torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]


def thd_alignment(tp: int, cp: int) -> int:
    """Each packed sequence's length is padded to a multiple of this (verl's `preprocess_packed_seqs`)."""
    return tp * cp * 2 if cp > 1 else tp


def alignment_padding(lengths: torch.Tensor, align: int) -> int:
    """How many alignment tokens the packed sequences of these lengths get in all."""
    return int(((-lengths) % align).sum())


def thd_partitioned_indices(cu_seqlens_padded: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """Which tokens of a padded THD stream CP rank `rank` holds, in its local order: per sequence (length a
    multiple of 2·cp), chunk `rank` then chunk 2cp-1-rank of 2·cp equal chunks (TE's thd_partition_indices_kernel:
    `offset = index < seq_len / 2 ? rank : 2 * (world_size - 1) - rank`)."""
    bounds = [int(b) for b in cu_seqlens_padded.tolist()]
    if cp == 1:
        return torch.arange(bounds[-1])
    parts = []
    for start, end in itertools.pairwise(bounds):
        if (end - start) % (2 * cp):
            raise ValueError(f"THD sequence of {end - start} tokens is not a multiple of 2*cp = {2 * cp}")
        chunk = (end - start) // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            parts.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def te_thd_split(cp: int, rank: int, faults: FaultPlan) -> THDSplit:
    """Megatron's THD CP split (TE's index map). Fault `thd_cp_chunk_order`: each sequence's two chunks land in
    the other order (chunk 2cp-1-r first), which the attention and RoPE, assuming TE's order, do not know."""
    swapped = faults.active("thd_cp_chunk_order") is not None

    def split(whole: dict[str, torch.Tensor], cu_seqlens_padded: torch.Tensor) -> dict[str, torch.Tensor]:
        if cp == 1:
            return whole
        index = thd_partitioned_indices(cu_seqlens_padded, cp, rank)
        if swapped:
            index = torch.cat([half for pair in index.split(_chunk_sizes(cu_seqlens_padded, cp))
                               for half in reversed(pair.chunk(2))])
        return {key: value[:, index.to(value.device)] for key, value in whole.items()}

    return split


def _chunk_sizes(cu_seqlens_padded: torch.Tensor, cp: int) -> list[int]:
    """Each sequence's local length on one CP rank (two chunks)."""
    return ((cu_seqlens_padded[1:] - cu_seqlens_padded[:-1]) // cp).tolist()


def pack_micro_batch(batch: Batch, rows: torch.Tensor, align: int,
                     values: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The rows' real tokens, each sequence padded at its end to a multiple of `align`: a dict of [1, T] tensors
    (`values` are [B, S] tensors aligned with the padded batch, gathered in stream order; 'row' / 'col' locate each
    token in the padded batch, -1 / 0 on alignment tokens; 'positions' count within each padded sequence) and the
    padded cu_seqlens."""
    packed = pack_rows(batch, rows)
    lengths = torch.tensor(packed.seqlens)
    padded_lengths = lengths + (-lengths) % align
    cu_padded = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu_padded[1:] = padded_lengths.cumsum(0)
    total = int(cu_padded[-1])
    slot = torch.cat([torch.arange(int(cu_padded[k]), int(cu_padded[k]) + int(n))
                      for k, n in enumerate(lengths.tolist())])  # where each real token goes in the stream
    whole: dict[str, torch.Tensor] = {}
    for key, source in {**values, "row": None, "col": None}.items():
        taken = packed.row if key == "row" else packed.col if key == "col" else packed.gather(source)
        fill = -1 if key == "row" else 0
        out = torch.full((total,), fill, dtype=taken.dtype)
        out[slot] = taken
        whole[key] = out[None]
    starts = torch.repeat_interleave(cu_padded[:-1].long(), padded_lengths)
    whole["positions"] = (torch.arange(total) - starts)[None]
    return whole, cu_padded


def packed_seq_params(cu_seqlens_padded: torch.Tensor, device: torch.device, faults: FaultPlan) -> Any:
    """PackedSeqParams as verl builds them: the padded boundaries as cu_seqlens and as cu_seqlens_padded. Fault
    `cu_seqlens_shift`: every inner boundary one token late (an off-by-one in building cu_seqlens)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens_padded.clone()
    if faults.active("cu_seqlens_shift"):
        cu[1:-1] += 1
    longest = int((cu[1:] - cu[:-1]).max())
    cu = cu.to(device)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                           cu_seqlens_kv_padded=cu, max_seqlen_q=longest, max_seqlen_kv=longest)
