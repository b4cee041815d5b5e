"""The pytest plugin, driven through pytester as a user's `pytest -m nightly` would be: in this process (a nested
session is far cheaper than a pytest process, which imports everything before it collects anything); pytest as a
process, signalled mid-scenario, is tested by test_signals."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

SCENARIOS = """
defaults: {device: cpu, marks: [nightly, pr]}
matrix:
  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}
  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}, faults: [{kind: mask_shift}], marks: [nightly]}
  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}, dtype: bf16, device: npu, marks: [nightly, npu]}
  - {model: tiny-qwen3, strategy: fsdp2, layout: {ulysses: 2}, broken: "tracked in #12", marks: [nightly]}
"""


def _project(pytester, cache_dir: Path) -> None:
    pytester.makefile(".yaml", **{"scenarios/cpu": SCENARIOS})
    pytester.makeini(f"[pytest]\naddopts = --parity-cache-dir={cache_dir} -p no:cacheprovider\n")


def test_collects_one_item_per_scenario_with_marks(pytester, cache_dir, monkeypatch):
    from parity.harness import session as session_module

    _project(pytester, cache_dir)
    started = []
    monkeypatch.setattr(session_module, "start_forkserver", lambda *server: started.append(server))
    result = pytester.runpytest_inprocess("-m", "nightly", "--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "scenarios/cpu.yaml::tiny-qwen3/fsdp2/dp2/fp32/cpu",
        "scenarios/cpu.yaml::tiny-qwen3/fsdp2/dp2/fp32/cpu+mask_shift",
        "scenarios/cpu.yaml::tiny-qwen3/fsdp2/dp2/bf16/npu",
        "scenarios/cpu.yaml::tiny-qwen3/fsdp2/ulysses2/fp32/cpu",
        "4 tests collected*",
    ])
    pr_only = pytester.runpytest_inprocess("-m", "pr and not npu", "--collect-only", "-q")
    pr_only.stdout.fnmatch_lines(["scenarios/cpu.yaml::tiny-qwen3/fsdp2/dp2/fp32/cpu", "1/4 tests collected*"])
    assert started == []  # collecting runs nothing: no forkserver


def test_runs_scenarios_reports_and_writes_junit(pytester, cache_dir, monkeypatch):
    from parity.harness import pytest_plugin
    from parity.harness import session as session_module
    from parity.harness.run import launch

    _project(pytester, cache_dir)
    junit = pytester.path / "junit.xml"
    monkeypatch.setattr(launch, "_expected", [])
    started = []  # (preload, scenario files collected so far, pid of the server running afterwards) per call
    collected = []
    collect = pytest_plugin.ScenarioFile.collect
    monkeypatch.setattr(pytest_plugin.ScenarioFile, "collect", lambda self: collected.append(self) or collect(self))

    def start(preload, exclude):
        launch.start_forkserver(preload, exclude)
        started.append((preload, len(collected), launch._server[0]))

    monkeypatch.setattr(session_module, "start_forkserver", start)
    # the nested session runs its scenarios on this session's warm forkserver (a pytest process would start its
    # own)
    result = pytester.runpytest_inprocess("-m", "nightly", f"--junitxml={junit}", "--parity-out=out")
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*FAIL tiny-qwen3/fsdp2/dp2/fp32/cpu+mask_shift",
        "*log-prob before training max |Δ| = * > limit 5e-05 (abs)",
        "*parity summary*",
        "*4 scenarios in * 1 pass, 1 fail, 0 error, 2 skip",
    ])
    result.stdout.fnmatch_lines(["SKIP x1: device npu: torch_npu is not installed* (tiny-qwen3/fsdp2/dp2/bf16/npu)",
                                "SKIP x1: marked broken: tracked in #12 (tiny-qwen3/fsdp2/ulysses2/fp32/cpu)"])
    assert (pytester.path / "out" / "summary.md").is_file()
    assert len((pytester.path / "out" / "results.jsonl").read_text().splitlines()) == 4
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert {"logprob_max_abs", "grad_norm_rel_max", "verdict"} <= properties.keys()
    # announced at collection, for whichever launch starts the session's forkserver first (a test's, often)
    assert "parity.engines.fsdp2.engine" in launch._expected
    assert "transformers.models.qwen3.modeling_qwen3" in launch._expected
    # and started before collection for the file's rows, importing while pytest collects; the selected rows'
    # preload at collection finish is served by that server, and so is the runner (one server in all)
    assert [files for _, files, _ in started] == [0, 1]
    assert all("parity.engines.fsdp2.engine" in preload for preload, _, _ in started)
    assert len({pid for _, _, pid in started}) == 1 and launch._server[0] == started[0][2]


def test_k_selects_ids_and_bad_files_are_collection_errors(pytester, cache_dir):
    _project(pytester, cache_dir)
    selected = pytester.runpytest_inprocess("-k", "ulysses", "--collect-only", "-q")
    selected.stdout.fnmatch_lines(["scenarios/cpu.yaml::tiny-qwen3/fsdp2/ulysses2/fp32/cpu", "1/4 tests collected*"])
    pytester.makefile(".yaml", **{"scenarios/bad": "matrix:\n  - {model: tiny-qwen3, strategy: fsdp3}\n"})
    bad = pytester.runpytest_inprocess("--collect-only", "-q")
    bad.stdout.fnmatch_lines(["*unknown strategy 'fsdp3' (did you mean 'fsdp2'?)*"])
    assert "Traceback" not in bad.stdout.str()


def test_a_session_without_xdist_never_publishes_worker_shards_left_by_an_earlier_run(pytester):
    """OUT/gw0 ... belong to the xdist run that wrote them: a later plain session over the same --parity-out (here
    one without scenarios) must not print or write their rows as its own."""
    stale = pytester.path / "out" / "gw0"
    stale.mkdir(parents=True)
    (stale / "results.jsonl").write_text('{"id": "stale/from/an/earlier/run", "verdict": "FAIL", "reasons": []}\n')
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--parity-out=out", "test_plain.py")
    result.assert_outcomes(passed=1)
    assert "stale/from/an/earlier/run" not in result.stdout.str()
    assert not (pytester.path / "out" / "summary.md").exists()


def test_the_forkserver_guess_reads_the_scenario_files_pytest_will_collect(tmp_path, monkeypatch):
    """Before collection the plugin finds the session's scenario files itself: those under a directory named
    scenarios (or named on the command line), not those in directories pytest does not enter (.venv, build)."""
    from parity.harness import pytest_plugin

    for name in ("scenarios/a.yaml", "tests/scenarios/b.yml", "tests/c.yaml", ".venv/lib/scenarios/d.yaml",
                 "build/scenarios/e.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("matrix: []\n")
    (tmp_path / "extra.yaml").write_text("matrix: []\n")

    class Config:
        args = (".", "extra.yaml::row")

        @staticmethod
        def getini(name):
            return {"norecursedirs": [".*", "build"], "parity_scenario_dirs": []}[name]

    monkeypatch.chdir(tmp_path)
    assert sorted(map(str, pytest_plugin._scenario_files(Config()))) == [
        "extra.yaml", "scenarios/a.yaml", "tests/scenarios/b.yml"]


def test_an_unusable_parity_out_or_history_is_a_usage_error_not_a_traceback(pytester, cache_dir, monkeypatch):
    from parity.harness import session as session_module

    _project(pytester, cache_dir)
    monkeypatch.setattr(session_module, "start_forkserver", lambda *server: None)
    (pytester.path / "taken").write_text("a file")
    bad_out = pytester.runpytest_inprocess("-m", "pr and not npu", "--parity-out=taken")
    assert bad_out.ret == 2 and "--parity-out taken: a file is there" in bad_out.stdout.str()
    assert "Traceback" not in bad_out.stdout.str() and "Traceback" not in bad_out.stderr.str()
    same = pytester.runpytest_inprocess("-m", "pr and not npu", "--parity-out=out", "--parity-history=out")
    assert same.ret == 4 and "--parity-history out is also the --parity-out directory" in same.stderr.str()
