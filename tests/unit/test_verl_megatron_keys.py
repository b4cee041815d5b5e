"""The verl Megatron key table and its validation (engines/verl/keys.py MEGATRON, engines/verl/rules.py): shared
keys reconcile with the layout (verl's None for the virtual pipeline and expert TP), the drops know verl's file,
and keys no read-back could verify are bad input naming the key. Parsing needs no verl; the checks against verl's
own config SKIP without it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from parity.engines.verl import keys, rules, source
from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file

pytestmark = pytest.mark.torch_free


def _prepare(layout: dict, verl: dict | None = None) -> tuple[dict, list]:
    raw = {"strategy": "verl_megatron", "layout": layout, "actor_rollout_ref": verl or {}}
    out, problems = rules.prepare_megatron(raw)
    return out, problems


def test_layout_fills_the_megatron_sizes_with_verls_none_for_unset_stages() -> None:
    out, problems = _prepare({"tp": 2, "sequence_parallel": True})
    flat = out["actor_rollout_ref"]
    assert not problems
    assert flat["actor.megatron.tensor_model_parallel_size"] == 2
    assert flat["actor.megatron.sequence_parallel"] is True
    assert flat["actor.megatron.virtual_pipeline_model_parallel_size"] is None  # vpp 1 is verl's None
    assert flat["actor.megatron.expert_tensor_parallel_size"] is None  # 'as tp' without expert parallelism
    out, _ = _prepare({"pp": 2, "vpp": 2, "ep": 2, "etp": 1})
    flat = out["actor_rollout_ref"]
    assert flat["actor.megatron.virtual_pipeline_model_parallel_size"] == 2
    assert flat["actor.megatron.expert_tensor_parallel_size"] == 1


def test_verl_sizes_set_the_layout_and_disagreements_are_named() -> None:
    out, problems = _prepare({}, {"actor": {"megatron": {"tensor_model_parallel_size": 2}}})
    assert not problems and out["layout"]["tp"] == 2
    _, problems = _prepare({"tp": 4}, {"actor": {"megatron": {"tensor_model_parallel_size": 2}}})
    assert problems and problems[0][0] == "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
    _, problems = _prepare({"tp": 2}, {"actor": {"megatron": {"expert_tensor_parallel_size": 1}}})
    assert problems and problems[0][0] == "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size"


def test_the_known_drops_name_verls_file() -> None:
    sp = keys.MEGATRON.read_back_for("actor.megatron.sequence_parallel")
    assert "verl/workers/engine/megatron/transformer_impl.py:328-333" in sp.dropped_in
    assert "verl/utils/megatron/optimizer.py" in keys.MEGATRON.read_back_for("actor.optim.betas").dropped_in
    # every override_transformer_config / override_ddp_config key has a read-back
    assert keys.MEGATRON.read_back_for("actor.megatron.override_transformer_config.anything").rule == \
        "mcore_transformer"
    assert keys.MEGATRON.read_back_for("actor.megatron.override_ddp_config.anything").rule == "mcore_ddp"


SCENARIO = """
defaults: {{model: tiny-qwen3-bf16, strategy: verl_megatron, dtype: bf16, layout: {{tp: 2, sequence_parallel: true}}}}
matrix:
  - actor_rollout_ref: {{actor: {{ppo_micro_batch_size_per_gpu: 2, megatron: {block}}}}}
"""


@pytest.mark.parametrize(("block", "key", "words"), [
    ("{vanilla_mbridge: true, override_ddp_config: {bucket_size: 1000}}",
     "actor_rollout_ref.actor.megatron.override_ddp_config.bucket_size", "overlap_grad_reduce"),
    ("{vanilla_mbridge: true, param_offload: true}", "actor_rollout_ref.actor.megatron.param_offload", "CPU"),
])
def test_keys_no_read_back_could_verify_are_bad_input(tmp_path: Path, block: str, key: str, words: str) -> None:
    from parity.harness.config.validate import check_scenario

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO.format(block=block)))
    with pytest.raises(ScenarioError) as raised:
        for scenario in load_file(path):
            check_scenario(scenario)
    assert raised.value.key == key and words in str(raised.value)


@pytest.mark.skipif(source.problem() is not None, reason=f"verl: {source.problem()}")
def test_verls_own_config_rejects_an_unknown_megatron_key(tmp_path: Path) -> None:
    from parity.harness.config.validate import check_scenario

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO.format(block="{vanilla_mbridge: true, tensor_paralel_size: 2}")))
    with pytest.raises(ScenarioError) as raised:
        for scenario in load_file(path):
            check_scenario(scenario)
    assert raised.value.key == "actor_rollout_ref.actor.megatron.tensor_paralel_size"
    assert "McoreEngineConfig" in str(raised.value)
