"""verl's engine vocabulary in every version: pre-#6316 names are migrated (mindspeed_mm included), the #6316
form and the #7374 form (strategy megatron on npu + override_transformer_config) both load as the MindSpeed
engine, and `parity migrate` says which vocabulary each verl block uses."""

from __future__ import annotations

import shutil

import pytest

from parity.engines.verl.vocabulary import vocabulary
from parity.harness.cli import main
from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from parity.harness.config.registry import spec_for
from tests.conftest import DATA

pytestmark = pytest.mark.torch_free


def test_mindspeed_mm_is_flagged_then_migrated(tmp_path, capsys):
    path = tmp_path / "mm.yaml"
    shutil.copy(DATA / "verl" / "mindspeed_mm.yaml", path)
    with pytest.raises(ScenarioError, match=r"'mm_kwargs' was renamed to 'fsdp_kwargs'"):
        load_file(path)
    assert main(["migrate", "--check", str(path)]) == 1
    assert "mindspeed_mm -> mindspeed_fsdp" in capsys.readouterr().out
    assert main(["migrate", str(path)]) == 0
    (scenario,) = load_file(path)
    assert scenario.strategy == "mindspeed_fsdp" and scenario.fsdp_kwargs == {"reshard_after_forward": True}
    assert main(["migrate", "--check", str(path)]) == 0


def test_both_current_verl_forms_load_as_the_mindspeed_engine():
    pr6316, pr7374 = load_file(DATA / "verl" / "every_version.yaml")
    for scenario in (pr6316, pr7374):
        assert spec_for(scenario).name == "mindspeed_megatron"
        # verl's McoreEngineConfig defaults: distributed optimizer on, expert_tensor_parallel_size null = tp
        assert scenario.mcore_kwargs == {"use_distributed_optimizer": True, "moe_token_dispatcher_type": "alltoall"}
        assert scenario.layout.tag() == "dp2-tp2-ep2-etp2-sp" and scenario.device == "npu"


def test_verl_megatron_off_npu_stays_the_plain_megatron_engine(write_yaml):
    path = write_yaml("matrix:\n  - model: tiny-qwen3\n    device: cpu\n    verl: {strategy: megatron, "
                      "override_transformer_config: {moe_token_dispatcher_type: alltoall}}\n")
    (scenario,) = load_file(path)
    assert scenario.strategy == "megatron"
    assert scenario.mcore_kwargs == {"use_distributed_optimizer": True, "moe_token_dispatcher_type": "alltoall"}


def test_override_transformer_config_must_be_a_mapping(write_yaml):
    path = write_yaml("matrix:\n  - {model: tiny-qwen3, verl: {strategy: megatron, override_transformer_config: 3}}\n")
    with pytest.raises(ScenarioError, match=r"key 'verl.override_transformer_config': .* must be a mapping"):
        load_file(path)


@pytest.mark.parametrize(("block", "device", "version"), [
    ({"strategy": "mindspeed_llm", "llm_kwargs": {}}, "npu", "before PR #6316"),
    ({"strategy": "mindspeed_mm"}, "npu", "before PR #6316"),
    ({"strategy": "mindspeed_megatron", "mcore_kwargs": {}}, "npu", "PR #6316 .. #7374"),
    ({"strategy": "megatron", "override_transformer_config": {}}, "npu", "since PR #7374"),
    ({"strategy": "megatron"}, "npu", "since PR #7374"),
    ({"strategy": "megatron"}, "cpu", "the same in every version"),
    ({"strategy": "fsdp", "fsdp_size": -1}, "npu", "the same in every version"),
])
def test_vocabulary_names_the_verl_version(block, device, version):
    assert version in vocabulary(block, device)


def test_migrate_reports_each_blocks_vocabulary(tmp_path, capsys):
    path = tmp_path / "v.yaml"
    shutil.copy(DATA / "verl" / "every_version.yaml", path)
    assert main(["migrate", "--check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "matrix[0].verl: verl PR #6316 .. #7374" in out and "matrix[1].verl: verl since PR #7374" in out
