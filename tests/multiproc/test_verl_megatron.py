"""verl's own Megatron engine under test (engines/verl/megatron.py): the rows of scenarios/verl_megatron.yaml run
through the three-way bf16 lane, each verl key read back from what verl built; the two verl drops FAIL naming verl's
file once their `broken` mark is lifted; a planted verl engine that drops one override_transformer_config key FAILs
naming the key and its clean twin PASSes; the resume row, resumed from verl's own checkpoint through Megatron's
distributed optimizer on torch's AdamW (broken upstream), still FAILs with its mark lifted (verl's default scheduler
flag: tests/multiproc/test_verl_nightly.py). SKIPs where verl is not installed (its own lane: verl pins
transformers < 5.11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.engines.verl import source
from parity.harness.config.matrix import load_file
from parity.harness.contract.schema import Scenario

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(source.problem() is not None, reason=f"verl: {source.problem()}")

PLANTED = """
defaults:
  model: tiny-qwen3-bf16
  dtype: bf16
  baseline: hf_master_weights
  layout: {tp: 2, sequence_parallel: true}
  actor_rollout_ref:
    model: {use_remove_padding: false}
    actor:
      ppo_micro_batch_size_per_gpu: 2
      megatron: {vanilla_mbridge: true, override_transformer_config: {KEY: true}}
matrix:
  - {engine: "tests.data.planted_verl_megatron:DropsOneKeyEngine", name: drops}
  - {engine: "tests.data.planted_verl_megatron:CleanTwinEngine", name: clean}
"""


def _megatron_rows() -> list[Scenario]:
    return [s for s in load_file(REPO / "scenarios" / "verl_megatron.yaml") if s.strategy == "verl_megatron"]


#: the rows by what tells them apart: the data path, a name, or the layout of the sequence-parallel drop
ROWS = {"padded": "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+vs-hf_master_weights",
        "packed": "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+packed+vs-hf_master_weights",
        "keys": "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+vs-hf_master_weights+keys",
        "tp2": "tiny-qwen3-bf16/verl_megatron/tp2/bf16/cpu+vs-hf_master_weights",
        "betas": "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+vs-hf_master_weights+betas",
        "resume": "tiny-qwen3-bf16/verl_megatron/tp2-sp/bf16/cpu+packed+resume2+vs-hf_master_weights+schedule"}


def _row(name: str) -> Scenario:
    return next(s for s in _megatron_rows() if s.id == ROWS[name])


def test_padded_and_keys_rows_pass_with_every_key_read_back(verl_runner) -> None:
    padded = verl_runner.run_scenario(_row("padded"))
    assert padded.status == "PASS", padded.reasons
    applied = padded.metrics["applied_kwargs"]["actor_rollout_ref"]
    assert applied["model.use_remove_padding"] is False  # the model's forward got padded (B, S) rows
    assert applied["actor.megatron.sequence_parallel"] is True
    assert applied["actor.megatron.tensor_model_parallel_size"] == 2
    keys = verl_runner.run_scenario(_row("keys"))
    assert keys.status == "PASS", keys.reasons
    applied = keys.metrics["applied_kwargs"]["actor_rollout_ref"]
    assert applied["actor.megatron.override_transformer_config.recompute_granularity"] == "full"
    assert applied["actor.megatron.override_ddp_config.bucket_size"] == 1000000
    assert applied["actor.megatron.override_ddp_config.grad_reduce_in_fp32"] is False  # verl's own default: True
    assert applied["actor.megatron.use_distributed_optimizer"] is False


def test_packed_row_runs_thd_through_the_cpu_thd_core_attention(verl_runner) -> None:
    packed = verl_runner.run_scenario(_row("packed"))
    assert packed.status == "PASS", packed.reasons
    assert packed.metrics["applied_kwargs"]["actor_rollout_ref"]["model.use_remove_padding"] is True


# watches verl's drops (the broken rows' lifted marks): the nightly's verl job runs it
@pytest.mark.nightly
@pytest.mark.parametrize(("name", "key", "where"), [
    ("tp2", "actor.megatron.sequence_parallel requested False", "transformer_impl.py:328-333"),
    ("betas", "actor.optim.betas requested [0.9, 0.95]", "verl/utils/megatron/optimizer.py:126-217")])
def test_verl_drops_fail_naming_verls_file(verl_runner, name: str, key: str, where: str) -> None:
    row = _row(name)
    assert row.broken  # the scenario file keeps the drop visible; lifted here to see the verdict
    verdict = verl_runner.run_scenario(row.model_copy(update={"broken": None}))
    assert verdict.status == "FAIL"
    assert any(key in r and where in r for r in verdict.reasons), verdict.reasons


def test_planted_verl_engine_dropping_one_override_key_fails_naming_it(verl_runner, write_yaml) -> None:
    from tests.data.planted_verl_megatron import DROPPED

    drops, clean = (verl_runner.run_scenario(s) for s in load_file(write_yaml(PLANTED.replace("KEY", DROPPED))))
    assert clean.status == "PASS", clean.reasons
    assert drops.status == "FAIL"
    assert drops.reasons == [f"engine kwargs not applied as given: actor_rollout_ref.actor.megatron."
                             f"override_transformer_config.{DROPPED} requested True, effective False"]


# watches an upstream defect (the broken resume row's lifted mark): the nightly's verl job runs it
@pytest.mark.nightly
def test_resume_from_verls_checkpoint_still_fails_on_megatrons_torch_adamw_path(verl_runner) -> None:
    """The resume row, its broken mark lifted: verl's Megatron engine on CPU runs Megatron's DistributedOptimizer on
    torch's AdamW, unpatched (engines/megatron/cpu_compat.py no longer imitates TE's fused Adam there), whose resume
    is broken upstream. When Megatron fixes it this test fails: lift the mark in scenarios/verl_megatron.yaml."""
    row = _row("resume")
    assert row.broken and "megatron/core/optimizer/distrib_optimizer.py" in row.broken
    verdict = verl_runner.run_scenario(row.model_copy(update={"broken": None}))
    assert verdict.status in ("FAIL", "ERROR"), verdict.reasons
    assert verdict.status == "ERROR" or any(r.startswith("resume:") for r in verdict.reasons), verdict.reasons

