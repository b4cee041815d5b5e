"""The per-rank memory plan (harness/config/memory.py): parameter counts of the real Qwen3 configs (shipped
config.json copies), the layout arithmetic, the flag on verl's 30B layout, and an order-of-magnitude check
against what a CPU run measures."""

from __future__ import annotations

import json

import pytest

from parity.harness.cli import main
from parity.harness.config.memory import estimate, param_counts
from parity.harness.config.validate import MemoryPlanWarning, check_memory
from parity.harness.contract.schema import Scenario
from tests.conftest import DATA, REPO
from tests.forked import run_forked
from tests.unit import memory_probe

CONFIGS = DATA / "configs"
BIG = {"batch_size": 16, "prompt_len": 512, "response_len": 512, "steps": 3}


def config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


@pytest.mark.parametrize(("name", "billions"), [("qwen3-0.6b", 0.596), ("qwen3-8b", 8.19), ("qwen3-30b-a3b", 30.53)])
def test_param_counts_match_the_published_sizes(name, billions):
    assert param_counts(config(name)).total / 1e9 == pytest.approx(billions, rel=2e-3)


def _moe(layout: dict, **kw) -> Scenario:
    return Scenario(model="x", strategy="mindspeed_megatron", layout=layout, device="npu", dtype="bf16",
                    workload=BIG, mcore_kwargs={"use_distributed_optimizer": True}, **kw)


def test_verl_30b_layout_on_8_cards_is_flagged_and_dp2_fits():
    over = estimate(_moe({"tp": 4, "pp": 2, "ep": 4, "sequence_parallel": True}), config("qwen3-30b-a3b"))
    assert over.params / 1e9 == pytest.approx(3.8, rel=0.02)  # dense / tp / pp + experts / ep per rank
    assert over.states == 18 * over.params  # dp = 1: bf16 weight 2 + fp32 grad 4 + master 4 + Adam 8, unsharded
    assert over.level == "over" and "OVER: likely OOM" in over.render()
    fits = estimate(_moe({"tp": 4, "pp": 2, "ep": 4, "dp": 2, "sequence_parallel": True}), config("qwen3-30b-a3b"))
    assert fits.level == "fits" and fits.optimizer == pytest.approx(over.optimizer / 2, rel=1e-6)


def test_without_the_distributed_optimizer_dp_shards_nothing():
    layout = {"tp": 4, "pp": 2, "ep": 4, "dp": 2, "sequence_parallel": True}
    sharded = estimate(_moe(layout), config("qwen3-30b-a3b"))
    whole = estimate(_moe(layout).model_copy(update={"mcore_kwargs": {}}), config("qwen3-30b-a3b"))
    assert whole.optimizer == pytest.approx(2 * sharded.optimizer, rel=1e-6)


def test_fsdp_shards_everything_over_the_world():
    one = Scenario(model="x", strategy="fsdp2", layout={"dp": 8}, device="npu", dtype="bf16", workload=BIG)
    two = one.model_copy(update={"layout": one.layout.model_copy(update={"dp": 16})})
    a, b = estimate(one, config("qwen3-8b")), estimate(two, config("qwen3-8b"))
    assert a.grads == pytest.approx(2 * b.grads, rel=1e-6) and a.optimizer == pytest.approx(2 * b.optimizer, rel=1e-6)


def test_plan_prints_the_estimate_and_flags_the_30b_row(monkeypatch, capsys):
    for var, name in (("QWEN3_0_6B_PATH", "qwen3-0.6b"), ("QWEN3_8B_PATH", "qwen3-8b"),
                      ("QWEN3_30B_A3B_PATH", "qwen3-30b-a3b")):
        monkeypatch.setenv(var, str(CONFIGS / name))
    assert main(["plan", str(REPO / "scenarios" / "ascend_nightly.yaml"), "--device", "npu"]) == 0
    out = capsys.readouterr().out
    blocks: dict[str, list[str]] = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            blocks[line] = []
        else:
            blocks[list(blocks)[-1]].append(line)
    flagged = [head for head, lines in blocks.items() if any("OVER: likely OOM" in line for line in lines)]
    assert flagged == ["qwen3-30b-a3b/mindspeed_megatron/tp4-pp2-ep4-sp/bf16/npu"]
    assert out.count("memory: weights") == out.count("world size")


def test_validation_warns_over_and_refuses_impossible():
    with pytest.warns(MemoryPlanWarning, match="OVER"):
        check_memory(_moe({"tp": 4, "pp": 2, "ep": 4, "sequence_parallel": True}).model_copy(
            update={"model": str(CONFIGS / "qwen3-30b-a3b")}))
    from parity.harness.config.errors import ScenarioError
    with pytest.raises(ScenarioError, match="cannot fit"):
        check_memory(Scenario(model=str(CONFIGS / "qwen3-30b-a3b"), strategy="megatron", device="npu",
                              dtype="bf16", workload=BIG))


def test_estimate_is_the_right_order_of_magnitude_on_cpu():
    """The estimate against what a CPU run measures as the harness does (peak RSS, devices.peak_memory_bytes),
    minus the process's RSS before the model exists: tiny models are too small for this (their states are KBs
    next to ~0.4 GB of runtime), so a 60 M-parameter Qwen3 (fp32 weights + grads + AdamW ~ 1 GB) is trained two
    steps in a process of its own, forked from the forkserver as ranks are (memory_probe)."""
    numbers = run_forked(memory_probe.measure)
    ratio = numbers["measured"] / numbers["estimated"]
    assert 0.5 < ratio < 2.0, numbers
