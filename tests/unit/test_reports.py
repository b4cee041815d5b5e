"""Renderers over verdict JSON: the parity table, the side-by-side view, shard merging."""

from __future__ import annotations

import json

import pytest

from parity.reports import results
from parity.reports.markdown import render
from parity.reports.pivot import strategy_pivot

pytestmark = pytest.mark.torch_free


def result(run_id: str, strategy: str, layout: str, value: float, verdict: str = "PASS", **extra) -> dict:
    return {"id": run_id, "strategy": strategy, "layout": layout, "dtype": run_id.split("/")[3], "device": "cpu",
            "reference": "hf_fp32", "verdict": verdict, "reasons": [] if verdict == "PASS" else ["why"],
            "metrics": {"logprob_max_abs": value, "wall_time_s": 1.5, "compute_time_s": 1.25}, **extra}


ROWS = [
    result("tiny-qwen3/fsdp2/dp2/fp32/cpu", "fsdp2", "dp2", 1.4e-6),
    result("tiny-qwen3/megatron/tp2/fp32/cpu", "megatron", "tp2", 2.4e-6),
    result("tiny-qwen3/megatron/tp2/fp32/cpu+grad_scale", "megatron", "tp2", 0.5, "FAIL", faults=["grad_scale"]),
    result("tiny-qwen3/fsdp2/dp2/bf16/cpu+vs-hf", "fsdp2", "dp2", 0.02, baseline="hf"),
]


def test_pivot_puts_strategies_side_by_side_without_fault_twins():
    text = strategy_pivot(ROWS)
    header, _, fp32, bf16 = text.splitlines()
    assert "fsdp2 dp2" in header and "megatron tp2" in header
    assert "1.4e-06 P" in fp32 and "2.4e-06 P" in fp32 and "5.0e-01" not in text
    assert bf16.startswith("| tiny-qwen3 | bf16") and "2.0e-02 P" in bf16
    assert strategy_pivot(ROWS[:1]) == ""  # one strategy: nothing to put side by side


def test_a_packed_row_sits_beside_the_padded_one():
    packed = result("tiny-qwen3/megatron/tp2/fp32/cpu+packed", "megatron", "tp2", 3.1e-6, packing="packed")
    header, _, fp32, _ = strategy_pivot([*ROWS, packed]).splitlines()
    assert "megatron tp2   |" in header and "megatron tp2 packed" in header
    assert "2.4e-06 P" in fp32 and "3.1e-06 P" in fp32


def test_markdown_summary_lists_reasons_and_overhead():
    text = render(ROWS, wall_s=12.0)
    assert "4 scenarios in 12.0 s: 3 pass, 1 fail, 0 error, 0 skip" in text
    assert "per-scenario overhead (launch + collect, outside compute): mean 0.25 s" in text
    assert "- **FAIL** `tiny-qwen3/megatron/tp2/fp32/cpu+grad_scale`\n  - why" in text


def test_shards_merge_and_a_rerun_replaces_a_row(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for row in ROWS[:2]:
        results.append(a, row)
    results.append(b, ROWS[1] | {"verdict": "FAIL"})
    merged = results.load([a, b])
    assert [r["id"] for r in merged] == [ROWS[0]["id"], ROWS[1]["id"]] and merged[1]["verdict"] == "FAIL"
    assert json.loads((a / "results.jsonl").read_text().splitlines()[0])["id"] == ROWS[0]["id"]


def test_nan_metrics_show_as_nan_not_as_missing():
    """A NaN log-prob used to render as '-', the same as a metric never measured."""
    from parity.reports.table import ERRORS, parity_table

    nan_row = result("tiny-qwen3/fsdp2/dp2/fp32/cpu", "fsdp2", "dp2", float("nan"), "FAIL")
    text = parity_table([nan_row], ERRORS)
    assert "| nan " in text


def test_a_torn_last_line_is_skipped_with_a_warning_and_a_bad_line_elsewhere_is_an_error(tmp_path, capsys):
    """A run killed mid-write leaves half a line: `parity report` / `history` read the rest and say so."""
    import pytest

    from parity.harness.cli import main

    for row in ROWS[:2]:
        results.append(tmp_path, row)
    path = tmp_path / "results.jsonl"
    whole = path.read_text()
    path.write_text(whole + results.dumps(ROWS[2])[:40])
    assert [r["id"] for r in results.load([tmp_path])] == [ROWS[0]["id"], ROWS[1]["id"]]
    assert f"{path} line 3 is cut off" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    assert main(["history", str(tmp_path)]) == 0
    path.write_text(results.dumps(ROWS[2])[:40] + "\n" + whole)
    with pytest.raises(ValueError, match=f"{path} line 1: "):
        results.load([tmp_path])
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 2
