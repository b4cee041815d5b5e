"""What the transformers-based engines feed their model: padded rows or one packed stream (engines/feeds.py)."""

from __future__ import annotations

import torch

from parity.engines.feeds import packed_feed, padded_feed, unpack
from parity.engines.fsdp2.ulysses import same_sequence
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schema import Fault, Workload
from parity.harness.contract.workload import build_batch, next_token_labels

BATCH = build_batch(Workload(batch_size=4, prompt_len=8, response_len=8, seed=11), 100)


def test_sp_slices_of_a_packed_stream_cover_it_once_with_pads_of_their_own():
    rows = torch.tensor([0, 1, 2, 3])
    total = int(BATCH.attention_mask.sum())
    feeds = [packed_feed(BATCH, rows, sp=3, sp_rank=r) for r in range(3)]
    assert all(f.tokens.shape == (1, (total + (-total) % 3) // 3) for f in feeds)
    real = torch.cat([f.real[0] for f in feeds])
    assert int(real.sum()) == total and not real[:total].logical_not().any()
    stream = feeds[0].stream_positions[0]
    # the sp alignment pads count 0, 1, ... (verl's ulysses_pad): a sequence of their own
    assert torch.equal(stream[total:], torch.arange((-total) % 3))
    labels = torch.cat([f.labels[0] for f in feeds])[:total]
    rows_, cols = torch.cat([f.row[0] for f in feeds])[:total], torch.cat([f.col[0] for f in feeds])[:total]
    assert torch.equal(labels, next_token_labels(BATCH)[rows_, cols])


def test_same_sequence_follows_the_restarting_positions_and_the_fault_erases_the_boundaries():
    feed = packed_feed(BATCH, torch.arange(4))
    lengths = BATCH.attention_mask.sum(1)
    blocks = torch.block_diag(*[torch.ones(n, n, dtype=torch.bool) for n in lengths.tolist()])
    assert torch.equal(same_sequence(feed.positions)[0], blocks)
    broken = packed_feed(BATCH, torch.arange(4), faults=FaultPlan((Fault(kind="packed_position_ids_continue"),)))
    assert same_sequence(broken.positions)[0].all()


def test_padded_feed_and_unpack_round_trip():
    feed = padded_feed(BATCH, torch.tensor([2, 3]), sp=2, sp_rank=1)
    assert feed.tokens.shape == (2, 8) and torch.equal(feed.tokens, BATCH.input_ids[2:, 8:])
    assert torch.equal(feed.key_padding, BATCH.attention_mask[2:].bool())
    packed = packed_feed(BATCH, torch.arange(4))
    back = unpack(BATCH, packed, packed.tokens.float())
    assert torch.equal(back, (BATCH.input_ids * BATCH.attention_mask).float())
