"""Precision that rounding cannot fake: an engine that computes in fp32 and rounds what it reports to bf16 (and
says it computed in bf16) FAILs in the three-way and the absolute lane; its clean twin PASSes. Before, the rounded
log-probs cleared the only lower bound (before-training max |Δ| >= 1e-3) and a self-reported dtype was believed."""

from __future__ import annotations

import pytest

from parity.harness.contract.schema import Fault, Scenario

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


STEP1_BASELINE = "pre-clip grad norm rel diff to the baseline at step 1"


@pytest.mark.parametrize(("fault", "caught_by"), [
    ({"kind": "grad_scale", "step": 1, "factor": 1.01}, STEP1_BASELINE),
    ({"kind": "module_grad_scale", "key": "layers.2.input_layernorm", "step": 1, "factor": 1.5},
     "layer 2 input_layernorm grad norm rel diff to the baseline at step 1"),
])
def test_a_small_gradient_defect_fails_against_the_same_recipe_baseline(runner, fault, caught_by):
    """Against the fp32 reference bf16's own gap hides a 1 % gradient scale and a x1.5 module gradient (both PASSed
    at 0.27 / 0.33 of their limits); against the baseline that ran the same recipe from the same weights, at step 1,
    they stand out (benchmarks/bf16_step1_spread.py). The clean twin is test_the_clean_bf16_twin_passes."""
    verdict = runner.run_scenario(bf16().model_copy(update={"faults": (Fault(**fault),)}))
    assert verdict.status == "FAIL"
    assert any(r.startswith(caught_by) for r in verdict.reasons), verdict.reasons
