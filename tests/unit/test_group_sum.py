"""An engine's pre-clip grad norm against the root-sum-square of its own module grad norms
(harness/judge/groups.py group_sum_checks): a norm that leaves out one rank's experts (Megatron took them for
tensor-parallel copies, as verl's tp2-ep2-etp1 rows once did) or counts a shard twice FAILs, every step,
while each module matches its reference; the consistent twin PASSes in every dtype."""

from __future__ import annotations

import math

import pytest

from parity.harness.contract.schema import Tolerance
from parity.harness.judge.groups import group_sum_checks
from parity.harness.judge.tolerances import limits_for
from parity.harness.run.records import RunRecord, StepRecord

GROUPS = {"embed_tokens": 2.0, "layers.0.self_attn.qkv": 2.5, "layers.0.mlp.experts": 0.6, "layers.1.mlp.experts": 0.4,
          "lm_head": 1.3}
WHOLE = math.sqrt(sum(v * v for v in GROUPS.values()))


def record(*norms: float) -> RunRecord:
    return RunRecord("r", "h", "ok", steps=[StepRecord(k + 1, 0.5, norm, 0.1, group_grad_norms=GROUPS)
                                            for k, norm in enumerate(norms)])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_norm_missing_half_of_one_layers_experts_fails_at_that_step(dtype):
    short = math.sqrt(WHOLE ** 2 - 0.6 ** 2 / 2)  # one of two expert-parallel ranks' share of layer 0
    checks = group_sum_checks(record(WHOLE, short), limits_for(dtype, Tolerance()))
    assert [(c.step, c.passed) for c in checks] == [(2, False)]
    assert "root-sum-square" in checks[0].reason()


def test_a_norm_counting_a_shard_twice_fails():
    twice = math.sqrt(WHOLE ** 2 + 0.4 ** 2)
    assert not group_sum_checks(record(twice), limits_for("fp32", Tolerance()))[0].passed


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_consistent_twin_passes_with_fp32_summation_noise(dtype):
    checks = group_sum_checks(record(WHOLE * (1 + 1e-7), WHOLE * (1 - 1e-7)), limits_for(dtype, Tolerance()))
    assert len(checks) == 1 and checks[0].passed


def test_a_run_without_module_norms_makes_no_such_check():
    bare = RunRecord("r", "h", "ok", steps=[StepRecord(1, 0.5, 3.0, 0.1)])
    assert group_sum_checks(bare, limits_for("fp32", Tolerance())) == []


def test_a_norm_rounded_to_bf16_passes_where_not_measured_and_fails_where_every_engine_sums_in_fp32():
    """Off the measured CPU rows an engine may take its norm from bf16 gradients (torch's clip_grad_norm_ rounds each
    per-tensor norm and their total): one such rounding passes there; on a CPU row of a class in MEASURED_ON_CPU,
    whose engines all sum full-precision gradients, it is past summation order."""
    rounded = record(WHOLE * (1 + 2 ** -9))
    assert group_sum_checks(rounded, limits_for("bf16", Tolerance()))[0].passed
    assert not group_sum_checks(rounded, limits_for("bf16", Tolerance(), measured=True))[0].passed
