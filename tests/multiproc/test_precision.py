"""Precision that rounding cannot fake: an engine that computes in fp32 and rounds what it reports to bf16 (and
says it computed in bf16) FAILs in the three-way and the absolute lane; its clean twin PASSes. Before, the rounded
log-probs cleared the only lower bound (before-training max |Δ| >= 1e-3) and a self-reported dtype was believed."""

from __future__ import annotations

import pytest

from parity.harness.contract.schema import Scenario

ROUNDING = "tests.data.rounding_engine:RoundingFSDP2Engine"
LOGPROBS_ONLY = "tests.data.rounding_engine:RoundedLogprobsFSDP2Engine"
EXACT_ENTROPY = "not computed in bf16: entropy before training max |Δ| vs fp32 = "
TOO_FINE = "not computed in bf16: entropy before training median |Δ| is "
TOO_COARSE = "entropy before training median |Δ| ratio to baseline = "
ROUNDED_ENTROPY = "not computed in bf16: entropy before training median |Δ| vs fp32 = "


def bf16(engine: str | None = None, baseline: str | None = "hf_master_weights") -> Scenario:
    who = {"engine": engine} if engine else {"strategy": "fsdp2"}
    return Scenario(model="tiny-llama", layout={"dp": 2}, dtype="bf16", baseline=baseline, timeout=180, **who)


@pytest.mark.parametrize(("engine", "baseline", "caught_by"), [
    (ROUNDING, "hf_master_weights", [TOO_COARSE]),  # rounded entropy: further from fp32 than bf16 arithmetic gets
    (LOGPROBS_ONLY, "hf_master_weights", [TOO_FINE, EXACT_ENTROPY]),  # fp32 entropy: nearer than it gets
    (LOGPROBS_ONLY, None, [EXACT_ENTROPY]),  # the absolute lane: no baseline to compare with
    (ROUNDING, None, [ROUNDED_ENTROPY]),
])
def test_fp32_compute_with_outputs_rounded_to_bf16_fails(runner, engine, baseline, caught_by):
    verdict = runner.run_scenario(bf16(engine, baseline))
    assert verdict.status == "FAIL", verdict.reasons
    for reason in caught_by:
        assert any(r.startswith(reason) for r in verdict.reasons), verdict.reasons
    assert verdict.metrics["logprobs_before"]["max_abs"] > 1e-3  # the rounded log-probs clear the old bound
    assert not any(r.startswith("computed in") for r in verdict.reasons)  # it claims bf16: the claim is not the check


def test_the_clean_bf16_twin_passes(runner):
    verdict = runner.run_scenario(bf16())
    assert verdict.status == "PASS", verdict.reasons
