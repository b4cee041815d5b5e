"""engines/verl/defects.py: a dynamic-bsz row is broken on a verl whose balanced partition fills a training
micro-batch past the row's token budget, judged by running verl's own partition on the row's data. Planted: verl's
partition regressed to merge two micro-batches marks the row, naming verl's file and the numbers; its clean twin
(the partition keeping every sequence alone) clears it; rows the harness runs unchanged on every verl (one
sequence per micro-batch's worth of budget) are never marked. Needs verl (the verl lane)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="the verl lane (ci/verl-lane.txt): the rule runs verl's own partition")

from parity.engines.verl import defects
from parity.harness.config.matrix import load_file
from parity.harness.config.models import model_shape
from parity.harness.config.validate import broken_here
from tests.conftest import REPO

ROWS = {s.name: s for s in load_file(REPO / "scenarios" / "verl.yaml") if s.name}
GRPO = ROWS["rlstep-grpo-nokl"]
SHAPE = model_shape(GRPO.model)


@pytest.fixture
def partition(monkeypatch):
    """Replace verl's partition (verl/utils/seqlen_balancing.py rearrange_micro_batches) with `wrap(real)`."""
    from verl.utils import seqlen_balancing

    real = seqlen_balancing.rearrange_micro_batches

    def plant(wrap):
        monkeypatch.setattr(seqlen_balancing, "rearrange_micro_batches", wrap(real))
    return plant


def test_a_partition_that_overfills_a_micro_batch_marks_the_row_naming_verls_file(partition):
    def merged(real):
        def rearrange(batch, max_token_len, **kwargs):
            micro, parts = real(batch, max_token_len, **kwargs)
            return micro[:-1], [*parts[:-2], parts[-2] + parts[-1]]  # the last two micro-batches as one
        return rearrange
    partition(merged)
    defect = defects.token_budget_partition(GRPO, SHAPE)
    assert defect is not None and "verl/utils/seqlen_balancing.py rearrange_micro_batches" in defect, defect
    assert "under a budget of 40" in defect and "rank 0's mini-batch 1" in defect, defect
    assert broken_here(GRPO) == defect


def test_a_partition_within_the_budget_leaves_the_row_unmarked(partition):
    def singletons(real):
        def rearrange(batch, max_token_len, **kwargs):
            micro, _ = real(batch, max_token_len, **kwargs)
            return micro, [[i] for i in range(len(batch))]
        return rearrange
    partition(singletons)
    assert defects.token_budget_partition(GRPO, SHAPE) is None


def test_rows_without_a_token_budget_are_never_asked():
    assert all(defects.token_budget_partition(row, model_shape(row.model)) is None for row in ROWS.values()
               if not row.actor_rollout_ref.get("actor.use_dynamic_bsz"))


def test_the_budget_row_whose_sequences_verl_can_always_fit_is_not_marked_on_any_verl():
    """uneven-budget splits its mini-batch unevenly, and every verl's partition fits it (0.9.1 and main 1dda039b9)."""
    assert defects.token_budget_partition(ROWS["uneven-budget"], SHAPE) is None


def test_the_mini_batches_are_each_ranks_consecutive_chunk_cut_in_order():
    lengths = list(range(16))
    assert defects.worker_mini_batches(GRPO, lengths) == [[(0, 1, 2, 3), (4, 5, 6, 7)],
                                                          [(8, 9, 10, 11), (12, 13, 14, 15)]]
