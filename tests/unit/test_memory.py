"""The per-rank memory plan (harness/config/memory.py): parameter counts of the real Qwen3 configs (shipped
config.json copies), the layout arithmetic, micro-batches in flight, recompute, offload, MoE buffers and the load
peak, the flags on the nightly's rows, and an order-of-magnitude check against what a CPU run measures
(benchmarks/memory_plan.py checks five layouts within 25 % with torch's allocation profile)."""

from __future__ import annotations

import json

import pytest

from parity.harness.cli import main
from parity.harness.config.memory import LOSS_VOCAB_COPIES, estimate, param_counts, stage_plans, with_load
from parity.harness.config.registry import spec_for
from parity.harness.config.validate import MemoryPlanWarning, check_memory
from parity.harness.contract.schema import Scenario
from tests.conftest import DATA, REPO
from tests.forked import run_forked
from tests.unit import memory_probe

pytestmark = pytest.mark.torch_free

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
    assert flagged == []  # the 30B fsdp2 row loads the way verl does: rank 0 on the host, each tensor broadcast
    assert "rank 0 reads on the host" in "".join(blocks["qwen3-30b-a3b/fsdp2/dp16/bf16/npu"])
    assert out.count("memory: weights") == out.count("world size")


def test_validation_warns_over_and_refuses_impossible():
    with pytest.warns(MemoryPlanWarning, match="OVER"):
        check_memory(_moe({"tp": 4, "pp": 2, "ep": 4, "sequence_parallel": True}).model_copy(
            update={"model": str(CONFIGS / "qwen3-30b-a3b")}))
    from parity.harness.config.errors import ScenarioError
    with pytest.raises(ScenarioError, match="cannot fit"):
        check_memory(Scenario(model=str(CONFIGS / "qwen3-30b-a3b"), strategy="megatron", device="npu",
                              dtype="bf16", workload=BIG))


@pytest.mark.nightly  # trains a 60 M-parameter model: a measurement of the estimate, run by the nightly's cpu lane
def test_estimate_is_the_right_order_of_magnitude_on_cpu():
    """The estimate against what a CPU run measures as the harness does (peak RSS, devices.peak_memory_bytes),
    minus the process's RSS before the model exists: tiny models are too small for this (their states are KBs
    next to ~0.4 GB of runtime), so a 60 M-parameter Qwen3 (fp32 weights + grads + AdamW ~ 1 GB) is trained two
    steps in a process of its own, forked from the forkserver as ranks are (memory_probe)."""
    pytest.importorskip("torch", reason="trains a model (the Python 3.10 lane has no torch)")
    numbers = run_forked(memory_probe.measure)
    ratio = numbers["measured"] / numbers["estimated"]
    assert 0.5 < ratio < 2.0, numbers


def _dense(layout: dict, strategy: str = "mindspeed_megatron", **kw) -> Scenario:
    return Scenario(model="x", strategy=strategy, layout=layout, device="npu", dtype="bf16", workload=BIG,
                    mcore_kwargs={"use_distributed_optimizer": True} if "megatron" in strategy else {}, **kw)


def test_megatron_activations_count_the_micro_batches_in_flight_not_every_row():
    """Qwen3-8B tp4 pp2, 16 rows over dp 1 in micro-batches of 1: stage 0 holds pp = 2 of them (1F1B), not 16."""
    qwen8 = config("qwen3-8b")
    first, last = stage_plans(_dense({"tp": 4, "pp": 2, "sequence_parallel": True}), qwen8)
    assert first.activations < 2e9 and "2 micro-batch(es) of 1 row(s) in flight" in first.in_flight
    assert last.activations == first.activations // 2 and last.loss > 0 == first.loss  # 1F1B's last stage: one
    first2, _ = stage_plans(_dense({"tp": 4, "pp": 2, "sequence_parallel": True}).model_copy(
        update={"mcore_kwargs": {"use_distributed_optimizer": True, "micro_batch_size": 2}}), qwen8)
    assert first2.activations == pytest.approx(2 * first.activations, rel=1e-6)
    deep, _ = stage_plans(_dense({"tp": 2, "pp": 4, "sequence_parallel": True}), qwen8)
    assert "4 micro-batch(es)" in deep.in_flight  # min(pp, micro-batches) at stage 0
    unpipelined = estimate(_dense({"tp": 8, "sequence_parallel": True}), qwen8)
    assert "1 micro-batch(es) of 1 row(s)" in unpipelined.in_flight


def test_interleaved_pipeline_holds_megatrons_warmup_chunks():
    """Rank 0 of the interleaved schedule: (pp - 1) * 2 + (vpp - 1) * pp warm-up chunk forwards + 1, each 1/vpp of
    the stage's layers: pp 2, vpp 2 -> 5 chunks = 2.5 stage micro-batches."""
    scenario = _dense({"tp": 4, "pp": 2, "vpp": 2, "sequence_parallel": True})
    assert "2.5 micro-batch(es)" in stage_plans(scenario, config("qwen3-8b"))[0].in_flight


def test_fsdp_activations_are_the_ranks_rows_in_one_pass_and_its_load_peak_is_named():
    scenario = _dense({"dp": 8}, strategy="mindspeed_fsdp")  # MindSpeed's FSDP engine loads on every rank
    plan = estimate(scenario, config("qwen3-8b"))
    assert "1 micro-batch(es) of 2 row(s)" in plan.in_flight  # 16 rows / dp 8, one forward
    counts = param_counts(config("qwen3-8b"))
    assert plan.load == 4 * counts.total and plan.load > plan.train  # every rank holds the whole fp32 model
    assert plan.verl_load == 4 * (counts.total // 8 + counts.largest_tensor)


def test_30b_fsdp_rows_fit_because_they_load_the_way_verl_does():
    scenario = _dense({"dp": 16}, strategy="fsdp2")
    counts = param_counts(config("qwen3-30b-a3b"))
    replicated = estimate(scenario, config("qwen3-30b-a3b"), with_load(spec_for(scenario).memory, "replicated"))
    assert replicated.level == "over" and replicated.load == pytest.approx(122e9, rel=0.01)
    verl = estimate(scenario, config("qwen3-30b-a3b"))  # fsdp2 loads on rank 0 and broadcasts (engines/hf/common.py)
    assert verl.level == "fits" and verl.total == verl.train  # the load peak is below the training peak
    assert verl.load == 4 * (counts.total // 16 + counts.largest_tensor)  # the shard + one tensor being broadcast
    assert verl.host_load == 4 * counts.total  # rank 0 reads the model on the host
    assert counts.largest_tensor == 128 * 2 * 768 * 2048  # transformers' fused expert gate_up, above the embedding


def test_full_recompute_keeps_layer_inputs_and_one_group():
    base = _dense({"tp": 4, "pp": 2, "sequence_parallel": True})
    full = base.model_copy(update={"mcore_kwargs": {"use_distributed_optimizer": True, "recompute_granularity": "full",
                                                    "recompute_method": "uniform", "recompute_num_layers": 1}})
    qwen8 = config("qwen3-8b")
    plain, recomputed = stage_plans(base, qwen8)[0], stage_plans(full, qwen8)[0]
    dims = param_counts(qwen8)
    # 18 layers on the stage, 2 micro-batches in flight, 1024 tokens / tp 4 (SP) of hidden 4096 in bf16
    assert recomputed.activations == 18 * 2 * 1024 * dims.hidden // 4 * 2
    assert recomputed.activations < plain.activations / 10 and recomputed.train <= plain.train


def test_optimizer_offload_and_fsdp_cpu_offload_leave_the_device():
    layout = {"tp": 4, "pp": 2, "ep": 4, "dp": 2, "sequence_parallel": True}
    on_device = estimate(_moe(layout), config("qwen3-30b-a3b"))
    half = estimate(_moe(layout).model_copy(update={"mcore_kwargs": {
        "use_distributed_optimizer": True, "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5}}),
        config("qwen3-30b-a3b"))
    assert half.optimizer == pytest.approx(on_device.optimizer / 2, rel=1e-3)
    verl = Scenario(model="x", strategy="verl_fsdp", layout={"dp": 8}, device="npu", dtype="bf16", workload=BIG,
                    actor_rollout_ref={"actor.fsdp_config.offload_policy": True})
    offloaded = estimate(verl, config("qwen3-8b"))
    assert offloaded.weights == offloaded.grads == offloaded.optimizer == 0


def test_moe_dispatch_buffers_and_router_count_for_moe_models_only():
    layout = {"tp": 4, "pp": 2, "ep": 4, "dp": 2, "sequence_parallel": True}
    moe = estimate(_moe(layout), config("qwen3-30b-a3b"))
    dense_like = {**config("qwen3-30b-a3b"), "num_experts": 0}
    assert moe.activations > estimate(_moe(layout), dense_like).activations


def test_the_loss_holds_vocabulary_wide_fp32_tensors_on_the_last_stage():
    """harness/contract/losses.py: log-softmax, its exp and their products' gradients over the whole vocabulary."""
    plan = estimate(_dense({"dp": 8}, strategy="fsdp2"), config("qwen3-8b"))
    dims = param_counts(config("qwen3-8b"))
    assert plan.loss == 2 * 1024 * dims.vocab * 4 * LOSS_VOCAB_COPIES
