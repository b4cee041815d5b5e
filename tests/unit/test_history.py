"""History and drift: a planted slowdown and a doubled error are flagged at the run they start in, with what
changed in that run's provenance; 20 clean noisy runs and one noisy run are not."""

from __future__ import annotations

import random
from pathlib import Path

from parity.harness.cli import main
from parity.harness.judge.drift import change_points
from parity.reports import history, results
from tests.unit.report_pages import result

ID = "tiny-qwen3/fsdp2/dp2/fp32/cpu"


def stored_runs(tmp: Path, step_times: list[float], errors: list[float] | None = None,
                torch_versions: list[str] | None = None) -> list[Path]:
    dirs = []
    for i, step in enumerate(step_times):
        row = result(ID, scale=(errors or [1e-6] * len(step_times))[i])
        row["metrics"] |= {"step_time_s": step, "tokens_per_s": 100 / step}
        version = (torch_versions or ["2.13.0"] * len(step_times))[i]
        row["provenance"] = {"started": f"2026-11-{10 + i}T17:00:00+00:00", "harness_commit": "abc",
                             "versions": {"torch": version}}
        directory = tmp / f"run-{i + 1}"
        results.append(directory, row)
        dirs.append(directory)
    return dirs


def test_a_planted_15_percent_slowdown_in_the_third_run_is_flagged_with_its_cause(tmp_path, capsys):
    dirs = stored_runs(tmp_path, [0.100, 0.101, 0.115], torch_versions=["2.13.0", "2.13.0", "2.14.0"])
    flags = history.detect(history.load_runs(dirs[::-1]))  # any order: sorted by when the runs started
    assert {(f.metric.key, f.run) for f in flags} == {("step_time_s", "run-3"), ("tokens_per_s", "run-3")}
    assert flags[0].provenance == ["versions.torch 2.13.0 -> 2.14.0"]
    assert main(["history", *map(str, dirs)]) == 1
    out = capsys.readouterr().out
    assert f"slowdown: {ID} step time +14.4% (0.1005 -> 0.115) first in run-3; changed: versions.torch" in out


def test_a_doubled_error_is_flagged(tmp_path):
    dirs = stored_runs(tmp_path, [0.1, 0.1, 0.1], errors=[1.4e-6, 1.4e-6, 2.8e-6])
    flags = history.detect(history.load_runs(dirs))
    assert [(f.metric.kind, f.metric.key, f.run) for f in flags] == [("error grown", "logprob_max_abs", "run-3")]
    assert flags[0].provenance == []


def test_twenty_clean_noisy_runs_flag_nothing(tmp_path, capsys):
    rng = random.Random(11)
    dirs = stored_runs(tmp_path, [rng.gauss(0.1, 0.002) for _ in range(20)])
    assert history.detect(history.load_runs(dirs)) == []
    assert main(["history", *map(str, dirs), "--html", "--out", str(tmp_path / "page")]) == 0
    assert "no change flagged" in capsys.readouterr().out and (tmp_path / "page" / "report.html").is_file()


def test_one_noisy_run_is_not_a_change_but_a_lasting_step_is():
    rng = random.Random(3)
    clean = [rng.gauss(1.0, 0.02) for _ in range(20)]
    spike = [*clean[:10], 1.4, *clean[11:]]
    assert change_points(spike, "up", 0.05) == []
    step = clean[:12] + [v * 1.10 for v in clean[12:]]
    assert [c.index for c in change_points(step, "up", 0.05)] == [12]
