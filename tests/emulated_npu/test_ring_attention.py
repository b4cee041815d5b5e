"""MindSpeed's ring attention on the emulated lane, with defects planted in a COPY of the real MindSpeed source
(tests/emulated_npu/planted_ring.py): each planted tree runs the padded cp row and must FAIL on the strict fp32
limits, its clean twin (the same copy, unplanted) must PASS. The padded row runs MindSpeed's general ring
strategy, which hands npu_fusion_attention KV blocks masked whole; the emulated op returns poison for them
(tests/emulated_npu/site/torch_npu/_attention.py), so a ring that reads or misweights those rows shows, where the
op's former refusal turned every such run into an ERROR. Skipped without PARITY_MINDSPEED_SRC."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.emulated_npu import lane
from tests.emulated_npu.planted_ring import PLANTS, copy_tree

pytestmark = pytest.mark.emulated_npu

#: the lane's padded cp row (scenarios/emulated_npu.yaml), one step
RING = """
description: planted MindSpeed ring-attention defects (tests/emulated_npu/test_ring_attention.py)
defaults: {{device: cpu, dtype: fp32, timeout: 300, model: tiny-qwen3, strategy: mindspeed_megatron,
            layout: {{cp: {cp}}}, mcore_kwargs: {{micro_batch_size: 2}},
            workload: {{batch_size: 4, prompt_len: 16, response_len: 16, steps: 1, loss: grpo}}}}
matrix:
  - {{name: ring}}
"""
#: the lane's plants, one in the mask and one in the block order (each planted tree is a run of its own); the
#: others run in the nightly (test_more_planted_ring_defects_fail)
LANE = ("mask_off_by_one_block", "merge_swaps_statistics")
POISONED = "npu_fusion_attention: fully masked rows poisoned"


def run_trees(source: Path, work: Path, cp: int, plants: tuple[str | None, ...]) -> dict[str | None, dict[str, Any]]:
    lane.skip_on_bad_megatron_pairing(source)
    (work / "ring.yaml").write_text(textwrap.dedent(RING.format(cp=cp)))
    found = {}
    for plant in plants:
        tree = copy_tree(source, work / f"tree-{plant}", plant)
        out = work / f"out-{plant}"
        done = lane.run_harness(["-m", "parity.harness.cli", "run", str(work / "ring.yaml"), "--out", str(out)],
                                tree)
        rows = list(lane.results(out).values())
        assert len(rows) == 1, f"{plant}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        found[plant] = rows[0]
    return found


def logprob_error(row: dict[str, Any]) -> str:
    return next(r for r in row["reasons"] if r.startswith("log-prob before training max |Δ|"))


@pytest.fixture(scope="module")
def cp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, dict[str, Any]]:
    return run_trees(lane.mindspeed_source(), tmp_path_factory.mktemp("ring_cp2"), 2, (None, *LANE))


def test_the_clean_copy_passes_through_poisoned_blocks(cp2: dict[str | None, dict[str, Any]]) -> None:
    """The clean twin: the unplanted copy PASSes the strict fp32 limits although the op returned poison for the
    masked blocks (the record counts those calls): MindSpeed's merge weighted them by 0."""
    clean = cp2[None]
    assert clean["verdict"] == "PASS", clean["reasons"]
    mindspeed = clean["record"]["provenance"]["mindspeed"]
    assert mindspeed["attention"]["core_attention"] == ["MindSpeedCPDotProductAttention"], mindspeed["attention"]
    assert mindspeed["fused_ops"].get(POISONED, 0) > 0, mindspeed["fused_ops"]


@pytest.mark.parametrize("plant", LANE)
def test_a_planted_ring_defect_fails(cp2: dict[str | None, dict[str, Any]], plant: str) -> None:
    """The mask of the wrong KV block; a merge that weights each block by the other's statistics (and so reads the
    poisoned block): each FAILs on the log-probs before any training step."""
    row = cp2[plant]
    assert row["verdict"] == "FAIL", (PLANTS[plant].why, row["reasons"])
    assert logprob_error(row), row["reasons"]


@pytest.mark.nightly
@pytest.mark.parametrize("cp,plant", [(2, "mask_polarity"), (2, "kv_block_id_not_advanced"),
                                      (4, "ring_rotation_reversed")])
def test_more_planted_ring_defects_fail(cp2: dict[str | None, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory,
                                        cp: int, plant: str) -> None:
    """An inverted mask; a KV block id the forward never advances; the ring's direction reversed, which only a ring
    of more than two blocks sees (at cp2 the previous and the next rank are the same): cp4, with its own clean
    twin."""
    work = tmp_path_factory.mktemp(f"ring_{plant}")
    found = run_trees(lane.mindspeed_source(), work, cp, (plant,) if cp == 2 else (None, plant))
    clean = cp2[None] if cp == 2 else found[None]
    assert clean["verdict"] == "PASS", clean["reasons"]
    row = found[plant]
    assert row["verdict"] == "FAIL", (PLANTS[plant].why, row["reasons"])
    assert logprob_error(row), row["reasons"]


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_every_plant_rewrites_one_line_of_the_tree(tmp_path: Path, plant: str) -> None:
    """Each plant finds its line in the tree under test (else the tree moved on: the plant must follow) and the
    copy differs from the tree there only."""
    source = lane.mindspeed_source()
    spec = PLANTS[plant]
    tree = copy_tree(source, tmp_path, plant)
    before, after = (source / spec.path).read_text().splitlines(), (tree / spec.path).read_text().splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and len(changed) == len(spec.old), changed
    assert [after[i].strip() for i in changed] == list(spec.new)


def test_a_plant_whose_line_moved_fails_loudly() -> None:
    from tests.emulated_npu.planted_ring import Plant, planted_text

    text = "class A:\n    def f(self):\n        return 1\n\n\ndef g():\n        return 1\n"
    plant = Plant("a.py", "class A:", ("return 1",), ("return 2",), "f returns 2")
    assert planted_text(text, plant) == text.replace("        return 1\n\n\n", "        return 2\n\n\n", 1)
    with pytest.raises(AssertionError, match="stands 0 times"):
        planted_text(text.replace("return 1\n\n", "return 3\n\n"), plant)  # upstream changed the line
    with pytest.raises(AssertionError, match="stands 2 times"):
        planted_text(text.replace("        return 1\n\n", "        return 1\n        return 1\n\n"), plant)
    with pytest.raises(AssertionError, match="at the top level"):
        planted_text(text.replace("class A:", "class B:"), plant)  # upstream moved the scope
