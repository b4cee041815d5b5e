"""Perf gates: a scenario's `perf:` limits against earlier runs of the same provenance FAIL or WARN as it says, only
when the growth is past the limit AND unlikely under the earlier runs' spread; fewer than 3 such runs (or runs of
another provenance) judge nothing, with a warning saying so."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from parity.harness.contract.schema import PerfGate, Scenario
from parity.harness.judge.drift import gate
from parity.harness.judge.verdict import Verdict

PROVENANCE = {"scenario_hash": "abc", "versions": {"torch": "2.13.0"}, "device_name": "runner-1", "image": None}


def earlier(*step_times: float, memory: float = 100.0, **changed) -> list[dict]:
    return [{"metrics": {"step_time_s": t, "peak_memory_mb": memory}, "provenance": PROVENANCE | changed}
            for t in step_times]


PAST = earlier(0.100, 0.102, 0.098, 0.101)


def verdict(step: float, memory: float = 100.0) -> Verdict:
    return Verdict("s", "PASS", metrics={"step_time_s": step, "peak_memory_mb": memory},
                   info={"provenance": PROVENANCE | {"started": "2026-12-03T17:00:00+00:00"}})


def test_a_slowdown_over_the_limit_fails_and_names_the_numbers():
    out = gate(verdict(0.115), PerfGate(max_slowdown=0.05), PAST)
    assert out.status == "FAIL" and len(out.reasons) == 1
    assert out.reasons[0].startswith("step time +14.7% over the geometric mean of 4 earlier runs of the same "
                                     "provenance (0.1002 -> 0.115; p = ")
    assert out.reasons[0].endswith("under their spread) > max_slowdown 5%") and "warnings" not in out.info


def test_memory_growth_warns_when_the_scenario_says_warn():
    out = gate(verdict(0.1, memory=125.0), PerfGate(max_memory_growth=0.10, on_breach="warn"),
               earlier(0.1, 0.1, 0.1, memory=100.0) + earlier(0.1, memory=101.0))
    assert out.status == "PASS" and out.info["warnings"][0].startswith("peak memory +24.")


def test_within_limits_noise_or_no_history_passes():
    assert gate(verdict(0.104), PerfGate(max_slowdown=0.05), PAST).status == "PASS"
    noisy = earlier(0.10, 0.13, 0.08, 0.12, 0.09)  # ±20 % runner noise: 6 % is not news, nor is 20 %
    assert gate(verdict(0.106), PerfGate(max_slowdown=0.05), noisy).status == "PASS"
    assert gate(verdict(0.12), PerfGate(max_slowdown=0.05), noisy).status == "PASS"
    assert gate(verdict(9.9), None, PAST).status == "PASS"


def test_fewer_than_three_runs_of_the_same_provenance_judge_nothing_and_say_so():
    """One earlier run made the gate compare with sigma = 0 (25 % false FAILs at 5 % noise); runs on another
    torch, device or scenario are another baseline."""
    other = earlier(0.05, 0.05, 0.05, versions={"torch": "2.14.0"}) + earlier(0.05, device_name="runner-2")
    for past, same in (([], 0), (earlier(0.05, 0.05), 2), (other, 0)):
        out = gate(verdict(9.9), PerfGate(max_slowdown=0.05), past)
        assert out.status == "PASS"
        assert out.info["warnings"][0].startswith(f"perf gate not judged: {same} earlier run(s) of the same "
                                                  "provenance")
    assert gate(verdict(9.9), PerfGate(max_slowdown=0.05), earlier(0.05, 0.051, 0.049) + other).status == "FAIL"


def test_the_gate_is_part_of_the_schema_but_not_of_the_run_identity():
    base = Scenario(model="tiny-qwen3", strategy="hf")
    gated = Scenario(model="tiny-qwen3", strategy="hf", perf={"max_slowdown": 0.05, "on_breach": "warn"})
    assert gated.perf == PerfGate(max_slowdown=0.05, on_breach="warn", timed_steps=5)
    assert gated.content_hash() == base.content_hash()  # cached references stay valid
    with pytest.raises(ValidationError):
        Scenario(model="tiny-qwen3", strategy="hf", perf={"max_slowdown": 0.05, "on_breach": "ignore"})
    with pytest.raises(ValidationError):  # a median of fewer steps is not the statistic the gate is built on
        Scenario(model="tiny-qwen3", strategy="hf", perf={"max_slowdown": 0.05, "timed_steps": 3})
