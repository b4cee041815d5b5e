"""`parity run --history DIR`: a scenario's perf gate reads the earlier runs and FAILs or WARNs as it says;
report.html is written by every run."""

from __future__ import annotations

import json

from parity.harness.cli import main
from parity.reports import results

GATED = """matrix:
  - {model: tiny-qwen3, strategy: hf, name: gate-fail, perf: {max_slowdown: 0.05}}
  - {model: tiny-qwen3, strategy: hf, name: gate-warn, perf: {max_memory_growth: 0.10, on_breach: warn}}
  - {model: tiny-qwen3, strategy: hf, name: no-gate}
"""
IDS = [f"tiny-qwen3/hf/single/fp32/cpu+{name}" for name in ("gate-fail", "gate-warn", "no-gate")]


def test_gates_fail_or_warn_against_the_history(write_yaml, tmp_path, cache_dir, capsys):
    past = tmp_path / "last-week"
    for run_id in IDS:  # last week every scenario was 1000x faster and used 1 MB: any real run breaches
        results.append(past, {"id": run_id, "verdict": "PASS", "metrics": {"step_time_s": 1e-4, "peak_memory_mb": 1}})
    out = tmp_path / "out"
    code = main(["run", str(write_yaml(GATED)), "--out", str(out), "--cache-dir", str(cache_dir),
                 "--history", str(past)])
    printed = capsys.readouterr().out
    rows = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert code == 1 and rows[IDS[0]]["verdict"] == "FAIL"
    assert any(r.startswith("step time +") and "max_slowdown 5%" in r for r in rows[IDS[0]]["reasons"])
    assert rows[IDS[1]]["verdict"] == "PASS" and rows[IDS[1]]["warnings"][0].startswith("peak memory +")
    assert rows[IDS[2]]["verdict"] == "PASS" and "warnings" not in rows[IDS[2]]
    assert f"WARN {IDS[1]}" in printed and (out / "report.html").is_file()
