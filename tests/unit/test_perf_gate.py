"""Perf gates: a scenario's `perf:` limits against its history FAIL or WARN as it says; noise and an
unchanged speed pass."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from parity.harness.contract.schema import PerfGate, Scenario
from parity.harness.judge.drift import gate
from parity.harness.judge.verdict import Verdict

PAST = [{"step_time_s": t, "peak_memory_mb": 100.0} for t in (0.100, 0.102, 0.098, 0.101)]


def verdict(step: float, memory: float = 100.0) -> Verdict:
    return Verdict("s", "PASS", metrics={"step_time_s": step, "peak_memory_mb": memory})


def test_a_slowdown_over_the_limit_fails_and_names_the_numbers():
    out = gate(verdict(0.115), PerfGate(max_slowdown=0.05), PAST)
    assert out.status == "FAIL"
    assert out.reasons == ["step time +14.4% over the median of 4 earlier runs (0.1005 -> 0.115) > max_slowdown 5%"]


def test_memory_growth_warns_when_the_scenario_says_warn():
    out = gate(verdict(0.1, memory=125.0), PerfGate(max_memory_growth=0.10, on_breach="warn"), PAST)
    assert out.status == "PASS" and out.info["warnings"][0].startswith("peak memory +25.0%")


def test_within_limits_noise_or_no_history_passes():
    assert gate(verdict(0.104), PerfGate(max_slowdown=0.05), PAST).status == "PASS"
    noisy = [{"step_time_s": t} for t in (0.10, 0.13, 0.08, 0.12, 0.09)]  # ±20 % runner noise: 6 % is not news
    assert gate(verdict(0.106), PerfGate(max_slowdown=0.05), noisy).status == "PASS"
    assert gate(verdict(9.9), PerfGate(max_slowdown=0.05), []).status == "PASS"
    assert gate(verdict(9.9), None, PAST).status == "PASS"


def test_the_gate_is_part_of_the_schema_but_not_of_the_run_identity():
    base = Scenario(model="tiny-qwen3", strategy="hf")
    gated = Scenario(model="tiny-qwen3", strategy="hf", perf={"max_slowdown": 0.05, "on_breach": "warn"})
    assert gated.perf == PerfGate(max_slowdown=0.05, on_breach="warn")
    assert gated.content_hash() == base.content_hash()  # cached references stay valid
    with pytest.raises(ValidationError):
        Scenario(model="tiny-qwen3", strategy="hf", perf={"max_slowdown": 0.05, "on_breach": "ignore"})
