"""The harness must be able to fail: each injected fault class FAILs on the right metric in a REAL
multi-process run, while the clean twin of the same scenario PASSES."""

from __future__ import annotations

import pytest

from parity.harness.config.matrix import load_file
from tests.conftest import DATA

SCENARIOS = {s.id: s for s in load_file(DATA / "faults.yaml")}
CLEAN = "tiny-llama/fsdp2/dp2/fp32/cpu"
CLEAN_BF16 = "tiny-llama/fsdp2/dp2/bf16/cpu+vs-hf"
CLEAN_TP = "tiny-qwen3/fsdp2/tp2/fp32/cpu"

#: faulted id -> a metric that must be among the FAIL reasons
EXPECTED = {
    # Adam's first step and clipping hide a uniform scale: only the pre-clip norm of THAT step shows it
    CLEAN + "+grad_scale": "pre-clip grad norm rel diff at step 2",
    CLEAN + "+rank_loss_scale+dropped": "pre-clip grad norm rel diff at step 1",
    CLEAN + "+rank_loss_scale+doubled": "pre-clip grad norm rel diff at step 1",
    CLEAN + "+rope_theta_int": "log-prob before training max |Δ|",
    CLEAN + "+mask_shift": "log-prob before training max |Δ|",
    CLEAN + "+local_token_norm": "loss rel diff at step 1",
    "tiny-llama/fsdp2/ulysses2/fp32/cpu+local_token_norm": "loss rel diff at step 1",
    "tiny-llama/fsdp2/dp2/bf16/cpu+mask_shift+vs-hf": "log-prob before training mean |Δ| ratio to baseline",
    # q/k-norm gradients left partial on each TP rank: the pre-clip norm sees it at once
    CLEAN_TP + "+tp_grad_reduce_skip": "pre-clip grad norm rel diff at step 1",
    # a low-precision scenario computed in fp32: every upper bound holds, the engine's read-back does not
    "tiny-llama/fsdp2/dp2/bf16/cpu+fp32-compute": "computed in fp32, the scenario asks for bf16",
    "tiny-llama/PlainHFEngine/single/bf16/cpu": "not computed in bf16",
    # 1e-6 of run-to-run noise: under every tolerance, so only the deterministic lane names it
    "tiny-qwen3/fsdp2/dp2/fp32/cpu+nondeterministic+twice": "not deterministic: run 2 pre-clip grad norm differs",
}


@pytest.mark.parametrize("clean_id", [CLEAN, CLEAN_BF16, CLEAN_TP, "tiny-qwen3/fsdp2/dp2/fp32/cpu+twice"])
def test_clean_twin_passes(runner, clean_id):
    verdict = runner.run_scenario(SCENARIOS[clean_id])
    assert verdict.status == "PASS", verdict.reasons


@pytest.mark.parametrize("fault_id", sorted(EXPECTED))
def test_injected_fault_fails_on_the_right_metric(runner, fault_id):
    verdict = runner.run_scenario(SCENARIOS[fault_id])
    assert verdict.status == "FAIL"
    assert any(reason.startswith(EXPECTED[fault_id]) for reason in verdict.reasons), verdict.reasons


def test_grad_scale_is_invisible_to_log_probs_after_the_step(runner):
    """Why the pre-clip grad norm must be compared: the after-step log-probs do not see a 2x gradient."""
    verdict = runner.run_scenario(SCENARIOS[CLEAN + "+grad_scale"])
    assert len(verdict.reasons) == 1
    assert verdict.reasons[0].startswith("pre-clip grad norm rel diff at step 2 = 1 > limit 5")
