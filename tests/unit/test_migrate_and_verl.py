"""Historic names: rejected with the new spelling, rewritten by `parity migrate`, gated by `--check`;
and verl-style engine config fields mapped onto the harness layout."""

from __future__ import annotations

import shutil

import pytest

from parity.harness.cli import main
from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from tests.conftest import DATA

pytestmark = pytest.mark.torch_free

OLD_FILES = sorted((DATA / "old").glob("*.yaml"))


@pytest.mark.parametrize("old", OLD_FILES, ids=lambda p: p.name)
def test_old_file_is_rejected_then_migrated(old, tmp_path, capsys):
    path = tmp_path / old.name
    shutil.copy(old, path)
    with pytest.raises(ScenarioError, match=r"renamed to 'mcore_kwargs'|is now 'mindspeed_megatron'"):
        load_file(path)
    assert main(["migrate", "--check", str(path)]) == 1
    assert path.read_text() == old.read_text()  # --check writes nothing
    assert main(["migrate", str(path)]) == 0
    text = path.read_text()
    assert "mindspeed_llm" not in text and "llm_kwargs" not in text
    assert text.splitlines()[0].startswith("# ")  # comments survive
    assert main(["migrate", "--check", str(path)]) == 0
    scenarios = load_file(path)
    assert scenarios and all(s.strategy in ("mindspeed_megatron", "fsdp2") for s in scenarios)
    out = capsys.readouterr().out
    assert "mindspeed_llm -> mindspeed_megatron" in out and "llm_kwargs -> mcore_kwargs" in out


def test_migrated_kwargs_keep_their_values(tmp_path):
    path = tmp_path / "m.yaml"
    shutil.copy(DATA / "old" / "mindspeed_matrix.yaml", path)
    main(["migrate", str(path)])
    moe = next(s for s in load_file(path) if "30b" in s.id)
    assert moe.mcore_kwargs == {"use_fused_rmsnorm": True, "moe_token_dispatcher_type": "alltoall"}


def test_verl_fields_map_onto_the_layout(write_yaml):
    path = write_yaml("""
        matrix:
          - model: tiny-qwen3-moe
            verl:
              strategy: megatron
              tensor_model_parallel_size: 2
              pipeline_model_parallel_size: 1
              virtual_pipeline_model_parallel_size: null
              context_parallel_size: 1
              expert_model_parallel_size: 2
              expert_tensor_parallel_size: 1
              sequence_parallel: true
              use_distributed_optimizer: true
              n_gpus_per_node: 4
              dtype: bfloat16
              mcore_kwargs: {moe_token_dispatcher_type: alltoall}
          - model: tiny-qwen3
            verl: {strategy: fsdp, fsdp_size: -1, ulysses_sequence_parallel_size: 2, n_gpus_per_node: 4,
                   reshard_after_forward: false}
    """)
    megatron, fsdp = load_file(path)
    assert megatron.id == "tiny-qwen3-moe/megatron/dp2-tp2-ep2-sp/bf16/cpu"
    assert megatron.mcore_kwargs == {"use_distributed_optimizer": True, "moe_token_dispatcher_type": "alltoall"}
    assert fsdp.strategy == "fsdp2" and (fsdp.layout.dp, fsdp.layout.ulysses) == (2, 2)
    assert fsdp.fsdp_kwargs == {"reshard_after_forward": False}


def test_verl_sequence_parallel_is_forced_off_at_tp1(write_yaml, capsys):
    path = write_yaml("matrix:\n  - {model: tiny-qwen3, verl: {strategy: megatron, sequence_parallel: true}}\n")
    assert load_file(path)[0].layout.sequence_parallel is False
    assert "sequence_parallel forced off because tensor_model_parallel_size is 1" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("verl: {strategy: megatron, tensor_model_paralel_size: 2}", "did you mean 'tensor_model_parallel_size'"),
    ("verl: {strategy: minspeed_megatron}", "did you mean 'mindspeed_megatron'"),
    ("verl: {strategy: megatron, llm_kwargs: {}}", "'llm_kwargs' was renamed to 'mcore_kwargs'"),
    ("verl: {strategy: megatron}\n    layout: {tp: 2}", "either as 'verl' or as 'layout'"),
])
def test_verl_block_errors_name_the_key(text, message, write_yaml):
    with pytest.raises(ScenarioError, match=message):
        load_file(write_yaml(f"matrix:\n  - model: tiny-qwen3\n    {text}\n"))
