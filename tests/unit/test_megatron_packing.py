"""Packed THD micro-batches for Megatron (engines/megatron/packing.py): verl's alignment, TE's CP partition."""

from __future__ import annotations

import pytest
import torch

from parity.engines.megatron.packing import (
    alignment_padding,
    pack_micro_batch,
    te_thd_split,
    thd_alignment,
    thd_partitioned_indices,
)
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schema import Fault, Workload
from parity.harness.contract.workload import build_batch


def test_alignment_is_verls():
    """verl's preprocess_packed_seqs: tp·cp·2 with CP, tp without."""
    assert [thd_alignment(tp, cp) for tp, cp in ((1, 1), (2, 1), (1, 2), (2, 2), (1, 3))] == [1, 2, 4, 8, 6]
    assert alignment_padding(torch.tensor([5, 8, 3]), 4) == 3 + 0 + 1


def test_partition_is_te_thd_partitioned_indices():
    """TE's thd_partition_indices_kernel, worked by hand for cu_seqlens [0, 8, 20], cp 2: rank 0 holds chunks 0
    and 3 of each sequence (chunk = len / 4), rank 1 chunks 1 and 2."""
    cu = torch.tensor([0, 8, 20])
    assert thd_partitioned_indices(cu, 2, 0).tolist() == [0, 1, 6, 7, 8, 9, 10, 17, 18, 19]
    assert thd_partitioned_indices(cu, 2, 1).tolist() == [2, 3, 4, 5, 11, 12, 13, 14, 15, 16]
    for cp in (1, 2, 3):
        cu = torch.tensor([0, 12, 12 + 6 * cp, 24 + 6 * cp])
        held = torch.cat([thd_partitioned_indices(cu, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(int(cu[-1])))  # every token on exactly one rank
    with pytest.raises(ValueError, match="multiple of 2"):
        thd_partitioned_indices(torch.tensor([0, 6]), 2, 0)


def test_the_chunk_order_fault_holds_the_same_tokens_in_the_other_order():
    cu = torch.tensor([0, 8, 20])
    whole = {"tokens": torch.arange(20)[None]}
    clean = te_thd_split(2, 0, FaultPlan())(whole, cu)["tokens"][0].tolist()
    swapped = te_thd_split(2, 0, FaultPlan((Fault(kind="thd_cp_chunk_order"),)))(whole, cu)["tokens"][0].tolist()
    assert clean == [0, 1, 6, 7, 8, 9, 10, 17, 18, 19] and swapped == [6, 7, 0, 1, 17, 18, 19, 8, 9, 10]


def test_pack_micro_batch_pads_each_sequence_at_its_end():
    batch = build_batch(Workload(batch_size=3, prompt_len=6, response_len=5, seed=5), 100)
    rows = torch.tensor([0, 2])
    whole, cu = pack_micro_batch(batch, rows, 4, {"tokens": batch.input_ids})
    lengths = batch.attention_mask[rows].sum(1)
    assert ((cu[1:] - cu[:-1]) % 4 == 0).all() and ((cu[1:] - cu[:-1]) - lengths < 4).all()
    for k, row in enumerate(rows.tolist()):
        start, n, end = int(cu[k]), int(lengths[k]), int(cu[k + 1])
        assert torch.equal(whole["tokens"][0, start:start + n], batch.input_ids[row][batch.attention_mask[row].bool()])
        assert (whole["row"][0, start:start + n] == row).all() and (whole["row"][0, start + n:end] == -1).all()
        assert torch.equal(whole["positions"][0, start:end], torch.arange(end - start))
