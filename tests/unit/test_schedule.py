"""The workload's learning-rate schedule (parity.harness.contract.schedule) against the schedulers the engines run:
transformers' (hf / fsdp2), Megatron's OptimizerParamScheduler configured as the megatron engine configures it,
and verl's own (torch_functional.py, in the verl lane). Each is an independent implementation of the same numbers;
a planted off-by-one in the contract's function (the scheduler's step counted from 1) must disagree with all."""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

from parity.harness.contract import schedule
from parity.harness.contract.schema import Scenario, Workload

SCHEDULES = [
    {},
    {"lr_warmup_steps": 3},
    {"lr_warmup_steps_ratio": 0.25},
    {"lr_scheduler_type": "cosine"},
    {"lr_scheduler_type": "cosine", "lr_warmup_steps": 4, "min_lr_ratio": 0.1},
    {"lr_scheduler_type": "cosine", "lr_warmup_steps_ratio": 0.1, "min_lr_ratio": 0.25},
    {"lr_scheduler_type": "linear", "lr_warmup_steps": 2},
    {"lr_scheduler_type": "linear"},
]


def _workload(**kwargs) -> Workload:
    return Workload(steps=12, lr=3e-4, **kwargs)


def _run(scheduler_step, optimizer, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler_step()
    return lrs


def transformers_lrs(workload: Workload) -> list[float]:
    from parity.engines.training import make_scheduler
    from parity.harness.contract.faults import FaultPlan

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=workload.lr)
    scheduler = make_scheduler(optimizer, workload, FaultPlan())
    return _run(lambda: (optimizer.step(), scheduler.step()), optimizer, workload.steps)


def megatron_lrs(workload: Workload) -> list[float]:
    """The engine's own construction (MegatronEngine.build_scheduler) over a stand-in optimizer: the scheduler only
    reads and writes `param_groups`."""
    pytest.importorskip("megatron.core")
    from parity.engines.megatron.engine import MegatronEngine
    from parity.harness.contract.faults import FaultPlan

    optimizer = SimpleNamespace(param_groups=[{"lr": 0.0, "weight_decay": 0.0}])
    engine = SimpleNamespace(optimizer=optimizer, ctx=SimpleNamespace(scenario=SimpleNamespace(workload=workload),
                                                                      faults=FaultPlan()))
    scheduler = MegatronEngine.build_scheduler(engine)
    return _run(lambda: scheduler.step(increment=1), optimizer, workload.steps)


def contract_lrs(workload: Workload) -> list[float]:
    return [schedule.lr_at(workload, k) for k in range(1, workload.steps + 1)]


@pytest.mark.parametrize("kwargs", SCHEDULES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("implementation", [transformers_lrs, megatron_lrs])
def test_engine_schedulers_follow_the_contract(kwargs, implementation):
    workload = _workload(**kwargs)
    assert implementation(workload) == pytest.approx(contract_lrs(workload), rel=1e-12, abs=1e-15)


def test_warmup_starts_from_zero_and_reaches_the_peak():
    workload = _workload(lr_warmup_steps=4, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    lrs = contract_lrs(workload)
    assert lrs[:5] == pytest.approx([0.0, 0.75e-4, 1.5e-4, 2.25e-4, 3e-4])
    assert min(lrs[4:]) > 0.1 * workload.lr and lrs[-1] < lrs[5]  # decays toward, not below, the floor


def test_a_planted_off_by_one_disagrees_with_every_implementation(monkeypatch):
    """The check has teeth: the contract counted from the first update instead of 0 (a scheduler stepped before
    its first update) no longer matches transformers' or Megatron's scheduler."""
    workload = _workload(lr_warmup_steps=3, lr_scheduler_type="cosine")
    right = contract_lrs(workload)
    monkeypatch.setattr(schedule, "lr_at", lambda wl, update: wl.lr * schedule.lr_factor(wl, update))
    wrong = contract_lrs(workload)
    for implementation in (transformers_lrs, megatron_lrs):
        ran = implementation(workload)
        assert ran == pytest.approx(right) and ran != pytest.approx(wrong)


@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl lane only: verl is not installed")
@pytest.mark.parametrize("kwargs", [k for k in SCHEDULES if k.get("lr_scheduler_type") != "linear"])
def test_verl_schedulers_follow_the_contract(kwargs):
    """verl's FSDP engine builds these (verl/workers/engine/fsdp/transformer_impl.py _build_lr_scheduler)."""
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    workload = _workload(**kwargs)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=workload.lr)
    warmup = schedule.warmup_steps(workload)
    if workload.lr_scheduler_type == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    else:
        scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup,
                                                    num_training_steps=workload.steps,
                                                    min_lr_ratio=workload.min_lr_ratio)
    assert _run(lambda: (optimizer.step(), scheduler.step()), optimizer, workload.steps) == \
        pytest.approx(contract_lrs(workload), rel=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 4, "lr_warmup_steps": 4}, "must end before the last step"),
    ({"steps": 10, "lr_warmup_steps_ratio": 1.0}, "must end before the last step"),
    ({"min_lr_ratio": 0.1}, "min_lr_ratio applies to lr_scheduler_type cosine only"),
    ({"lr_scheduler_type": "linear", "min_lr_ratio": 0.1}, "cosine only"),
])
def test_schedules_no_engine_can_follow_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Workload(**kwargs)


def test_schedule_fields_stay_out_of_the_hash_at_their_defaults():
    """Every cached reference and golden predates them."""
    dumped = Workload().model_dump()
    assert not set(dumped) & set(
        ("weight_decay_exempt", "lr_warmup_steps", "lr_warmup_steps_ratio", "lr_scheduler_type", "min_lr_ratio"))
    assert Scenario(model="tiny-qwen3", strategy="hf").content_hash() == "c270cdc5943cc4e2"
    assert "lr_scheduler_type" in Workload(lr_scheduler_type="cosine").model_dump()
    plain = Scenario(model="tiny-qwen3", strategy="megatron", layout={"tp": 2}, workload={"steps": 4})
    assert plain.model_copy(update={"resume": None, "convert": False}).content_hash() == plain.content_hash()


@pytest.mark.parametrize("name, ndim, exempt, decays", [
    ("model.layers.0.self_attn.q_proj.weight", 2, "biases_and_norms", True),
    ("model.layers.0.self_attn.q_proj.bias", 1, "biases_and_norms", False),
    ("model.layers.0.input_layernorm.weight", 1, "biases_and_norms", False),
    ("model.layers.0.self_attn.q_norm.weight", 1, "biases_and_norms", False),
    ("model.layers.0.mlp.experts.gate_up_proj", 3, "biases_and_norms", True),
    ("model.layers.0.input_layernorm.weight", 1, "none", True),
])
def test_weight_decay_groups(name, ndim, exempt, decays):
    assert schedule.decays(name, ndim, exempt) is decays


def test_describe_names_the_schedule():
    text = schedule.describe(_workload(lr_warmup_steps=4, lr_scheduler_type="cosine", min_lr_ratio=0.1))
    assert text == "lr 0.0003, warmup 4, cosine to 0.1 x lr over 12 steps"
    assert math.isclose(schedule.lr_factor(_workload(lr_scheduler_type="linear"), 12), 0.0, abs_tol=1e-15)
