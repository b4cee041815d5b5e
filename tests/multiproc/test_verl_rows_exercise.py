"""verl's rows exercise what they name, read from what verl did (the micro-batches its `prepare_micro_batches` made,
recorded in provenance.verl.micro_batches), and verl's FSDP engine reports a per-module gradient fingerprint that
names the module a planted gradient fault hits, while its clean twin PASSes. The verl lane of .ci/run; the
Megatron layouts' counterparts run nightly (tests/multiproc/test_verl_layouts.py). SKIPs where verl is not
installed."""

from __future__ import annotations

from typing import Any

import pytest

from parity.engines.verl import source
from parity.harness.config.matrix import load_file
from parity.harness.contract.schema import Fault, Scenario
from tests.conftest import REPO

# the nightly's verl job (not .ci/run's verl lane, whose budget it exceeded): what verl's rows exercise, read back
pytestmark = [pytest.mark.multiprocess, pytest.mark.nightly,
              pytest.mark.skipif(source.problem() is not None, reason=f"verl lane only: {source.problem()}")]

VERL = {s.id: s for s in load_file(REPO / "scenarios" / "verl.yaml")}
MEGATRON = {s.id: s for s in load_file(REPO / "scenarios" / "verl_megatron.yaml")}
UNEVEN = "tiny-qwen3/verl_fsdp/dp2/fp32/cpu+packed+uneven-budget"
PACKED_MEGATRON = "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+packed+vs-hf_master_weights"
FINGERPRINTED = "tiny-qwen3/verl_fsdp/dp2/fp32/cpu+packed"


def train_micro_batches(verdict: Any) -> list[dict[str, Any]]:
    calls = [c for c in verdict.info["provenance"]["verl"]["micro_batches"] if c["phase"] == "train"]
    assert calls, verdict.info["provenance"]["verl"]
    return calls


def longest_sequence(scenario: Scenario) -> int:
    return scenario.workload.prompt_len + scenario.workload.response_len


def assert_uneven_token_split(verdict: Any, scenario: Scenario) -> None:
    """verl split by tokens, into micro-batches of different sizes, each within the budget given."""
    budget = scenario.actor_rollout_ref["actor.ppo_max_token_len_per_gpu"]
    assert verdict.status == "PASS", verdict.reasons
    for call in train_micro_batches(verdict):
        assert call["by_tokens"], call
        assert len(set(call["rows"])) > 1, call  # an uneven split: not every micro-batch holds as many sequences
        assert max(call["tokens"]) <= budget < sum(call["tokens"]), call


def assert_packs_several(verdict: Any, scenario: Scenario) -> None:
    """Every training micro-batch is one packed stream of two or more sequences, longer than any one of them."""
    assert verdict.status == "PASS", verdict.reasons
    assert verdict.metrics["applied_kwargs"]["actor_rollout_ref"]["model.use_remove_padding"] is True
    for call in train_micro_batches(verdict):
        assert min(call["rows"]) >= 2, call
        assert min(call["tokens"]) > longest_sequence(scenario), call


def test_token_budget_row_splits_each_ranks_batch_unevenly(verl_runner) -> None:
    assert_uneven_token_split(verl_runner.run_scenario(VERL[UNEVEN]), VERL[UNEVEN])


def test_packed_megatron_row_packs_several_sequences_per_micro_batch(verl_runner) -> None:
    row = MEGATRON[PACKED_MEGATRON]
    assert_packs_several(verl_runner.run_scenario(row), row)


def fingerprint_checked(verdict: Any, steps: int) -> None:
    """Groups were reported and compared at every step (a build that reports none is not compared at all)."""
    worst = verdict.metrics["group_grad_norm_rel"]
    assert len(worst) == steps and all(w is not None for w in worst), worst


def module_fault(scenario: Scenario, group: str) -> Scenario:
    return scenario.model_copy(update={"faults": (Fault(kind="module_grad_scale", key=group, step=1, factor=1.5),)})


def assert_fails_naming_only(verdict: Any, group: str) -> None:
    """FAIL, the scaled module named at step 1, and no other module at step 1."""
    from parity.harness.contract.grad_groups import describe

    assert verdict.status == "FAIL"
    named = [r for r in verdict.reasons if " grad norm rel diff at step 1" in r and not r.startswith("pre-clip")]
    assert named and all(r.startswith(f"{describe(group)} grad norm rel diff at step 1") for r in named), \
        verdict.reasons


def test_fsdp_fingerprint_names_the_module_a_planted_fault_scales(verl_runner) -> None:
    clean = VERL[FINGERPRINTED]
    verdict = verl_runner.run_scenario(clean)
    assert verdict.status == "PASS", verdict.reasons
    fingerprint_checked(verdict, clean.workload.steps)
    group = "layers.1.post_attention_layernorm"
    assert_fails_naming_only(verl_runner.run_scenario(module_fault(clean, group)), group)
