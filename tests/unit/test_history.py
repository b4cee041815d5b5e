"""History and drift: a planted slowdown, a doubled error, a slow creep and a regression that undoes an
improvement are flagged at the run they start in, with what changed in that run's provenance; clean noisy histories
(one scenario, or many at once: the false discovery rate holds over all of them) and one noisy run are not; runs
are ordered by when they ran, whatever their rows' verdicts. The rates on 75 x 20 synthetic histories are
benchmarks/drift_rule.py's."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest

from parity.harness.cli import main
from parity.harness.judge.drift import METRICS, change_points, flag_changes
from parity.reports import history, results
from tests.unit.report_pages import result

pytestmark = pytest.mark.torch_free

ID = "tiny-qwen3/fsdp2/dp2/fp32/cpu"
STEP_TIME = next(m for m in METRICS if m.key == "step_time_s")


def noisy(n: int, noise: float = 0.01, seed: int = 11, level: float = 0.1) -> list[float]:
    rng = random.Random(seed)
    return [level * math.exp(rng.gauss(0.0, noise)) for _ in range(n)]


def stored_runs(tmp: Path, step_times: list[float], errors: list[float] | None = None,
                torch_versions: list[str] | None = None) -> list[Path]:
    dirs = []
    for i, step in enumerate(step_times):
        row = result(ID, scale=(errors or [1e-6] * len(step_times))[i])
        row["metrics"] |= {"step_time_s": step, "tokens_per_s": 100 / step}
        version = (torch_versions or ["2.13.0"] * len(step_times))[i]
        row["provenance"] = {"started": f"2026-11-{10 + i:02d}T17:00:00+00:00", "harness_commit": "abc",
                             "versions": {"torch": version}}
        directory = tmp / f"run-{i + 1}"
        results.append(directory, row)
        dirs.append(directory)
    return dirs


def test_a_planted_15_percent_slowdown_is_flagged_with_its_cause(tmp_path, capsys):
    times = noisy(8) + [t * 1.15 for t in noisy(3, seed=12)]
    dirs = stored_runs(tmp_path, times, torch_versions=["2.13.0"] * 8 + ["2.14.0"] * 3)
    flags = history.detect(history.load_runs(dirs[::-1]))  # any order: sorted by when the runs started
    assert {(f.metric.key, f.run) for f in flags} == {("step_time_s", "run-9"), ("tokens_per_s", "run-9")}
    assert flags[0].provenance == ["versions.torch 2.13.0 -> 2.14.0"]
    assert main(["history", *map(str, dirs)]) == 1
    out = capsys.readouterr().out
    assert f"slowdown: {ID} step time +1" in out and "first in run-9; changed: versions.torch" in out


def test_a_doubled_error_is_flagged(tmp_path):
    """A deterministic error (CPU runs are bit-identical) has no noise: any change past the margin is one."""
    dirs = stored_runs(tmp_path, noisy(6), errors=[1.4e-6] * 5 + [2.8e-6])
    flags = history.detect(history.load_runs(dirs))
    assert [(f.metric.kind, f.metric.key, f.run) for f in flags] == [("error grown", "logprob_max_abs", "run-6")]
    assert flags[0].provenance == []


def test_twenty_clean_noisy_runs_flag_nothing(tmp_path, capsys):
    dirs = stored_runs(tmp_path, noisy(20, noise=0.02))
    assert history.detect(history.load_runs(dirs)) == []
    assert main(["history", *map(str, dirs), "--html", "--out", str(tmp_path / "page")]) == 0
    assert "no change flagged" in capsys.readouterr().out and (tmp_path / "page" / "report.html").is_file()


def test_one_noisy_run_is_not_a_change_but_a_lasting_step_is():
    clean = noisy(20, noise=0.02, seed=3, level=1.0)
    assert change_points([*clean[:10], 1.4, *clean[11:]], "up", 0.05) == []
    assert [c.index for c in change_points(clean[:12] + [v * 1.10 for v in clean[12:]], "up", 0.05)] == [12]


def test_a_slow_creep_and_a_regression_that_undoes_an_improvement_are_flagged():
    clean = noisy(20, noise=0.01, seed=5, level=1.0)
    creep = change_points([v * 1.01 ** i for i, v in enumerate(clean)], "up", 0.05)
    assert [(c.kind, c.index, c.runs) for c in creep] == [("creep", 0, 20)] and creep[0].relative > 0.15
    undone = change_points([v * (0.9 if 5 <= i < 12 else 1.0) for i, v in enumerate(clean)], "up", 0.05)
    assert [(c.kind, c.index) for c in undone] == [("step", 12)]  # the improvement itself is no flag


def test_the_false_flag_rate_holds_over_many_scenarios_and_the_one_that_moved_is_found():
    """Each of 60 clean series tested alone at 5 % would flag ~3 of them; over all at once, none is."""
    series = {i: (noisy(16, noise=0.03, seed=100 + i), STEP_TIME) for i in range(60)}
    assert flag_changes(series) == {}
    series[7] = ([*series[7][0][:12], *(v * 1.25 for v in series[7][0][12:])], STEP_TIME)
    assert [(key, [c.index for c in changes]) for key, changes in flag_changes(series).items()] == [(7, [12])]


def test_runs_are_ordered_by_when_they_ran_even_when_every_row_skipped_or_errored(tmp_path):
    """A run holding only SKIP / ERROR rows used to carry no start time and sort as the oldest."""
    dirs = stored_runs(tmp_path, [0.1, 0.1])
    skipped = tmp_path / "run-1b"
    results.append(skipped, {"id": ID, "verdict": "SKIP", "reasons": ["no device"],
                             "provenance": {"started": "2026-11-10T18:00:00+00:00"}})
    bare = tmp_path / "run-0"  # no start time at all (an old results file): when it was written
    results.append(bare, {"id": ID, "verdict": "ERROR", "reasons": ["x"]})
    os.utime(bare / "results.jsonl", (1_000_000_000, 1_000_000_000))
    runs = history.load_runs([*dirs, skipped, bare])
    assert [run.label for run in runs] == ["run-0", "run-1", "run-1b", "run-2"]


def test_changes_since_the_previous_run_name_verdict_moves_new_and_gone_rows_and_flags(tmp_path):
    dirs = stored_runs(tmp_path, noisy(8))
    earlier = history.load_runs(dirs)
    now = [result(ID, "FAIL") | {"metrics": {"step_time_s": 0.2, "tokens_per_s": 500.0}},
           result("tiny-llama/hf/single/fp32/cpu")]
    lines = history.changes_since(earlier, now, "tonight")
    assert lines[:2] == [f"since run-8: PASS -> FAIL: {ID}", "since run-8: new: tiny-llama/hf/single/fp32/cpu (PASS)"]
    assert any(line.startswith(f"since run-8: slowdown: {ID} step time +") for line in lines)
    assert history.changes_since(earlier, [result(ID) | {"metrics": earlier[-1].results[ID]["metrics"]}]) == [
        "since run-8: none"]


def test_the_perf_gate_reads_the_history_as_parity_history_does(tmp_path):
    """One reader of earlier runs: the runner's perf-gate history is `parity history`'s runs, oldest first whatever
    order the directories are given in, PASS / FAIL rows only."""
    pytest.importorskip("torch", reason="the runner imports the launchers (the Python 3.10 lane has no torch)")
    from parity.harness.runner import load_history

    dirs = stored_runs(tmp_path, [1.0, 2.0, 3.0])
    skipped = result("tiny-llama/hf/dp1/fp32/cpu", verdict="SKIP")
    results.append(dirs[0], skipped)
    past = load_history(dirs[::-1])
    assert [row["metrics"]["step_time_s"] for row in past[ID]] == [1.0, 2.0, 3.0]
    assert "tiny-llama/hf/dp1/fp32/cpu" not in past
# ---- statistics that see a step: noiseless series, a step across the matrix ---------------------------------
LOGPROB = next(m for m in METRICS if m.key == "logprob_max_abs")


def deterministic(level: float, nights: int) -> list[float]:
    """A CPU error metric: bit-identical run after run (a power of two, so its log's mean is exact too)."""
    return [level] * nights


@pytest.mark.parametrize("moved", [2.0 ** -10, 2.0 ** -18])  # 1000x and 4x: both past the 50 % margin
def test_a_noiseless_series_that_moves_past_its_margin_is_flagged_alone_and_among_noisy_ones(moved):
    """p = 0 is the strongest evidence there is: it was read as "nothing accepted" and flagged nothing."""
    planted = [*deterministic(2.0 ** -20, 10), moved]
    assert [(c.index, c.p) for c in change_points(planted, "up", LOGPROB.margin)] == [(10, 0.0)]
    others = {i: (noisy(11, noise=0.03, seed=40 + i), STEP_TIME) for i in range(1, 30)}
    assert [key for key in flag_changes({0: (planted, LOGPROB), **others})] == [0]
    quiet = {i: (deterministic(2.0 ** -(20 + i % 3), 11), LOGPROB) for i in range(1, 30)}
    assert [key for key in flag_changes({0: (planted, LOGPROB), **quiet})] == [0]


def test_a_noiseless_series_that_stays_or_moves_within_its_margin_is_not_flagged():
    assert change_points(deterministic(2.0 ** -20, 11), "up", LOGPROB.margin) == []
    assert change_points([*deterministic(2.0 ** -20, 10), 2.0 ** -20 * 1.25], "up", LOGPROB.margin) == []
    assert change_points([*deterministic(2.0 ** -20, 10), 2.0 ** -21], "up", LOGPROB.margin) == []  # better


def matrix(nights: int, scenarios: int = 60, noise: float = 0.05, seed: int = 7) -> dict[int, tuple[list, object]]:
    rng = random.Random(seed)
    return {i: ([base * math.exp(rng.gauss(0.0, noise)) for _ in range(nights)], STEP_TIME)
            for i, base in enumerate(rng.uniform(0.05, 2.0) for _ in range(scenarios))}


def moved_on(series: dict, night: int, factor, which=None) -> dict:
    return {key: ([v * (factor(key) if i >= night and (which is None or which(key)) else 1.0)
                   for i, v in enumerate(values)], metric) for key, (values, metric) in series.items()}


def test_a_night_on_which_every_step_time_grows_15_percent_is_one_change_across_the_matrix():
    """+15 % at 5 % noise: too weak in most series alone, unmistakable across 60 of them."""
    from parity.harness.judge.drift import matrix_changes

    clean = matrix(14)
    assert matrix_changes(clean) == []
    stepped = moved_on(clean, 13, lambda _: 1.15)
    [change] = matrix_changes(stepped)
    assert (change.index, change.scenarios) == (13, 60) and change.worse > 50 and 0.10 < change.relative < 0.20
    assert change.p < 1e-10
    assert len(flag_changes(stepped)) < 60  # the per-series rule alone misses most of them


def test_a_matrix_that_moves_both_ways_or_in_a_few_scenarios_or_not_at_all_is_no_matrix_change():
    from parity.harness.judge.drift import matrix_changes

    clean = matrix(14)
    assert matrix_changes(moved_on(clean, 13, lambda key: 1.15 if key % 2 else 1 / 1.15)) == []  # mixed
    assert matrix_changes(moved_on(clean, 13, lambda _: 1.15, which=lambda key: key < 10)) == []  # a few
    assert matrix_changes(moved_on(clean, 13, lambda _: 1.03)) == []  # inside the 5 % margin
    noiseless = {i: (deterministic(2.0 ** -(20 + i % 4), 14), LOGPROB) for i in range(40)}
    assert matrix_changes(noiseless) == []
    doubled = moved_on(noiseless, 13, lambda _: 2.0)
    assert [(c.index, c.worse) for c in matrix_changes(doubled)] == [(13, 40)]


def test_parity_history_reports_a_matrix_wide_slowdown_as_one_change(tmp_path, capsys):
    rng = random.Random(3)
    ids = [f"tiny-qwen3/fsdp2/dp{i}/fp32/cpu" for i in range(40)]
    dirs = []
    for night in range(10):
        directory = tmp_path / f"night-{night + 1}"
        for run_id in ids:
            row = result(run_id)
            step = 0.1 * math.exp(rng.gauss(0.0, 0.05)) * (1.15 if night == 9 else 1.0)
            row["metrics"] |= {"step_time_s": step, "tokens_per_s": 100 / step}
            row["provenance"] = {"started": f"2026-11-{10 + night:02d}T17:00:00+00:00",
                                 "image": "runner-b" if night == 9 else "runner-a"}
            results.append(directory, row)
        dirs.append(directory)
    assert main(["history", *map(str, dirs)]) == 1
    out = capsys.readouterr().out
    assert "slowdown across the matrix: step time +1" in out and "in night-10; changed: image runner-a -> runner-b" \
        in out
    assert main(["history", *map(str, dirs[:9])]) == 0  # its clean twin: the nights before
