"""`parity run --history DIR`: a scenario's perf gate times 5 extra steps and compares their median with earlier
runs of the same provenance, FAILing or WARNing as it says (fewer than 3 such runs, or runs of another provenance:
tests/unit/test_perf_gate.py). report.html says what changed since the latest earlier run."""

from __future__ import annotations

from parity.harness.cli import main
from parity.harness.config.matrix import load_file
from parity.harness.run.worker import _rank_provenance
from parity.reports import results

GATED = """matrix:
  - {model: tiny-llama, strategy: hf, name: gate-fail, perf: {max_slowdown: 0.05}}
  - {model: tiny-llama, strategy: hf, name: gate-warn, perf: {max_memory_growth: 0.10, on_breach: warn}}
  - {model: tiny-llama, strategy: hf, name: no-gate}
"""
IDS = [f"tiny-llama/hf/single/fp32/cpu+{name}" for name in ("gate-fail", "gate-warn", "no-gate")]


def test_gates_fail_or_warn_against_earlier_runs_of_the_same_provenance(write_yaml, tmp_path, cache_dir, capsys):
    path = write_yaml(GATED)
    here = _rank_provenance("cpu")
    for i, step in enumerate((1.0e-4, 1.1e-4, 0.9e-4)):  # last week every scenario was 1000x faster, used 1 MB
        past = tmp_path / f"night-{i}"
        for scenario in load_file(path):
            provenance = {**here, "scenario_hash": scenario.content_hash(), "started": f"2026-11-2{i}T17:00:00"}
            results.append(past, {"id": scenario.id, "verdict": "PASS", "provenance": provenance,
                                  "metrics": {"step_time_s": step, "peak_memory_mb": 1}})
    other = tmp_path / "other-runner"  # another torch, 1000x slower: were it a baseline, nothing would breach
    for run_id in IDS:
        results.append(other, {"id": run_id, "verdict": "PASS", "metrics": {"step_time_s": 0.1, "peak_memory_mb": 1e5},
                               "provenance": {**here, "versions": {"torch": "0.0"}}})
    out = tmp_path / "out"
    history = [arg for i in range(3) for arg in ("--history", str(tmp_path / f"night-{i}"))]
    code = main(["run", str(path), "--out", str(out), "--cache-dir", str(cache_dir), *history, "--history",
                 str(other)])
    printed = capsys.readouterr().out
    rows = {r["id"]: r for r in results.load([out])}
    assert code == 1 and rows[IDS[0]]["verdict"] == "FAIL"
    assert any(r.startswith("step time +") and "of 3 earlier runs of the same provenance" in r
               and "max_slowdown 5%" in r for r in rows[IDS[0]]["reasons"]), rows[IDS[0]]["reasons"]
    assert rows[IDS[0]]["metrics"]["steady_steps"] == 5  # the gate's figure: the median of 5 timed steps
    assert rows[IDS[1]]["verdict"] == "PASS" and rows[IDS[1]]["warnings"][0].startswith("peak memory +")
    assert rows[IDS[2]]["verdict"] == "PASS" and "warnings" not in rows[IDS[2]]
    assert rows[IDS[2]]["metrics"]["steady_steps"] == 1  # no gate: the workload's steps after a warm-up
    assert f"WARN {IDS[1]}" in printed and (out / "report.html").is_file()
    page = (out / "report.html").read_text()  # against the latest of the history: other-runner, written last
    # the previous night named at the top, then its verdict changes (reports/provenance.py)
    assert "since the previous night" in page and f"PASS -&gt; FAIL: {IDS[0]}" in page
