"""verl's Megatron engine beyond tp2 (scenarios/nightly/verl_megatron_layouts.yaml), run by the nightly verl job
(.github/workflows/nightly.yml `verl-cpu`; too slow for .ci/run's verl lane): every row PASSes with each parallel
size read back from megatron.core.parallel_state; the MoE row's per-module gradient fingerprint, read under verl's
distributed optimizer from each data-parallel rank's reduce-scattered slice, names the expert group a planted
fault scales and nothing else; the packed cp2 row packs several sequences into each micro-batch; the token-budget
row splits the batch unevenly. SKIPs where verl is not installed."""

from __future__ import annotations

import pytest

from parity.engines.verl import source
from parity.harness.config.matrix import load_file
from tests.conftest import REPO
from tests.multiproc.test_verl_rows_exercise import (
    assert_fails_naming_only,
    assert_packs_several,
    assert_uneven_token_split,
    fingerprint_checked,
    module_fault,
)

pytestmark = [pytest.mark.nightly, pytest.mark.multiprocess,
              pytest.mark.skipif(source.problem() is not None, reason=f"verl: {source.problem()}")]

LAYOUTS = {s.id: s for s in load_file(REPO / "scenarios" / "nightly" / "verl_megatron_layouts.yaml")}
EP2 = "tiny-qwen3-moe-bf16/verl_megatron/dp2-ep2/bf16/cpu+packed+vs-hf_master_weights"
CP2 = "tiny-qwen3-bf16/verl_megatron/cp2/bf16/cpu+packed+vs-hf_master_weights"
UNEVEN = "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+packed+vs-hf_master_weights+uneven-budget"
#: row -> the megatron.core.parallel_state sizes verl must have built
SIZES = {
    EP2: {"expert_model_parallel_size": 2, "tensor_model_parallel_size": 1},
    "tiny-qwen3-moe-bf16/verl_megatron/tp2-ep2-sp/bf16/cpu+packed+vs-hf_master_weights+etp1":
        {"expert_model_parallel_size": 2, "tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 1},
    CP2: {"context_parallel_size": 2},
    "tiny-qwen3-bf16/verl_megatron/pp2-vpp2/bf16/cpu+packed+vs-hf_master_weights":
        {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
}


@pytest.mark.parametrize("row", sorted(SIZES))
def test_layout_rows_pass_with_their_parallel_sizes_read_back(verl_runner, row: str) -> None:
    verdict = verl_runner.run_scenario(LAYOUTS[row])
    assert verdict.status == "PASS", verdict.reasons
    applied = verdict.metrics["applied_kwargs"]["actor_rollout_ref"]
    for key, size in SIZES[row].items():
        assert applied[f"actor.megatron.{key}"] == size, (key, applied)
    fingerprint_checked(verdict, LAYOUTS[row].workload.steps)


def test_moe_fingerprint_under_the_distributed_optimizer_names_the_scaled_experts(verl_runner) -> None:
    clean = LAYOUTS[EP2]
    assert clean.actor_rollout_ref.get("actor.megatron.use_distributed_optimizer", True)  # verl's default
    group = "layers.2.mlp.experts"
    assert_fails_naming_only(verl_runner.run_scenario(module_fault(clean, group)), group)


def test_packed_cp2_row_packs_several_sequences_per_micro_batch(verl_runner) -> None:
    assert_packs_several(verl_runner.run_scenario(LAYOUTS[CP2]), LAYOUTS[CP2])


def test_token_budget_row_splits_the_batch_unevenly(verl_runner) -> None:
    assert_uneven_token_split(verl_runner.run_scenario(LAYOUTS[UNEVEN]), LAYOUTS[UNEVEN])
