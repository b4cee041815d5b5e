"""The per-module gradient fingerprint's naming and its check, on their own (the real engines' group norms are
checked in tests/multiproc/test_faults.py)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from parity.engines.megatron.convert import ModelArch, Shard, hf_to_mcore, te_name
from parity.engines.megatron.grad_groups import mcore_group
from parity.engines.megatron.hf_weights import SafetensorsCheckpoint
from parity.harness.config.models import TINY_MODELS, ensure_checkpoint
from parity.harness.contract.grad_groups import describe, hf_group
from parity.harness.contract.schema import Tolerance
from parity.harness.judge.groups import group_checks
from parity.harness.judge.tolerances import limits_for
from parity.harness.run.records import RunRecord, StepRecord


def _squares(named: dict[str, torch.Tensor], group_of) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, tensor in named.items():
        group = group_of(name)
        out[group] = out.get(group, 0.0) + float(tensor.double().square().sum())
    return out


@pytest.mark.parametrize("model", sorted(TINY_MODELS))
@pytest.mark.parametrize("te", [False, True])
def test_megatron_names_land_in_the_same_groups_as_hf(model, te, cache_dir):
    """Every HF weight and its Megatron counterpart (fused qkv / fc1, per-expert, TE's fused norms) fall in the
    same group: per group, the sums of squares agree (Megatron's vocabulary padding is zeros)."""
    import transformers

    path = ensure_checkpoint(model, cache_dir)
    arch = ModelArch.from_hf_config(transformers.AutoConfig.from_pretrained(path))
    hf = dict(SafetensorsCheckpoint(path))
    layers = {local: local for local in range(arch.num_layers)}
    mcore = hf_to_mcore(hf, arch, Shard(), layers, pre_process=True, post_process=True)
    if te:
        mcore = {te_name(name): tensor for name, tensor in mcore.items()}

    def megatron(name: str) -> str:
        match = re.match(r"^decoder\.layers\.(\d+)\.", name)
        return mcore_group(f"module.module.{name}", layers[int(match.group(1))] if match else None)

    ours, theirs = _squares(hf, hf_group), _squares(mcore, megatron)
    assert sorted(ours) == sorted(theirs)
    assert {g: pytest.approx(v, rel=1e-9) for g, v in ours.items()} == theirs
    assert all(re.fullmatch(r"embed_tokens|norm|lm_head|layers\.\d+\.[a-z_]+(\.[a-z_]+)?", g) for g in ours), ours


def test_group_names_read_as_layer_and_module():
    assert hf_group("model.layers.2.self_attn.q_norm.weight") == "layers.2.self_attn.q_norm"
    assert hf_group("model.layers.0.block_sparse_moe.experts.3.w1.weight") == "layers.0.mlp.experts"
    assert hf_group("model.layers.1._checkpoint_wrapped_module.mlp.down_proj.weight") == "layers.1.mlp.down_proj"
    assert hf_group("model.vision_tower.proj.weight") == "vision_tower.proj"  # unknown: its own module's group
    assert hf_group("model.model.layers.0.mlp.gate_proj.weight") == "layers.0.mlp.gate_up"  # a wrapper named model
    assert describe("layers.2.self_attn.q_norm") == "layer 2 self_attn.q_norm"
    assert describe("lm_head") == "lm_head"


def _record(groups: dict[str, float] | None, grad_norm: float = 10.0) -> RunRecord:
    return RunRecord(run_id="r", scenario_hash="h", status="ok",
                     steps=[StepRecord(step=1, loss=1.0, grad_norm=grad_norm, step_time_s=0.0,
                                       group_grad_norms=groups)])


REF = {"embed_tokens": 9.0, "layers.0.self_attn.q_norm": 1.0, "layers.0.input_layernorm": 1e-6}
FP32 = limits_for("fp32", Tolerance())


def test_clean_groups_pass_and_tiny_groups_sit_under_the_absolute_floor():
    """1e-6 of relative noise passes; a group of 1e-6 that is 5e-6 off is within 1e-6 x global norm 10."""
    candidate = _record({**REF, "layers.0.self_attn.q_norm": 1.0 + 1e-6, "layers.0.input_layernorm": 6e-6})
    checks, worst = group_checks(candidate, _record(REF), FP32)
    assert all(c.passed for c in checks) and len(checks) == 1
    assert worst == pytest.approx(5.0)


def test_a_wrong_group_fails_naming_layer_module_and_step():
    checks, worst = group_checks(_record({**REF, "layers.0.self_attn.q_norm": 1.41}), _record(REF), FP32)
    failing = [c.reason() for c in checks if not c.passed]
    assert len(failing) == 1 and failing[0].startswith("layer 0 self_attn.q_norm grad norm rel diff at step 1 = 0.41")
    assert worst == pytest.approx(0.41)


def test_a_missing_or_extra_group_fails_and_no_groups_is_not_compared():
    missing = {k: v for k, v in REF.items() if k != "embed_tokens"}
    checks, _ = group_checks(_record(missing), _record(REF), FP32)
    assert [c.metric for c in checks if not c.passed] == ["embed_tokens grad norm rel diff"]
    checks, _ = group_checks(_record({**REF, "layers.0.mlp.experts": 1.0}), _record(REF), FP32)
    assert [c.note for c in checks if not c.passed] == ["group not reported by the reference"]
    assert group_checks(_record(None), _record(REF), FP32) == ([], None)
    nan = group_checks(_record({**REF, "embed_tokens": math.nan}), _record(REF), FP32)
    assert not all(c.passed for c in nan[0]) and math.isnan(nan[1])


def test_the_worker_takes_group_norms_as_floats_and_names_a_bad_entry():
    from parity.harness.contract.engine import StepOutput
    from parity.harness.run.worker import EngineOutputError, checked_groups

    assert checked_groups(StepOutput(1.0, 2.0, {"lm_head": torch.tensor(2.0).item(), "norm": 1}), 1) == {
        "lm_head": 2.0, "norm": 1.0}
    assert checked_groups(StepOutput(1.0, 2.0), 1) is None
    with pytest.raises(EngineOutputError, match=r"step 3\): StepOutput.group_grad_norms: entry 'norm'"):
        checked_groups(StepOutput(1.0, 2.0, {"norm": "big"}), 3)
    with pytest.raises(EngineOutputError, match="is list, expected a dict"):
        checked_groups(StepOutput(1.0, 2.0, [1.0]), 1)
