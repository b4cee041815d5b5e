"""The `parity` CLI end to end: exit codes, outputs, step summary, merging shards, listing."""

from __future__ import annotations

import contextlib
import io
import json
import os
from types import SimpleNamespace

import pytest

from parity.harness.cli import main
from tests.unit.test_markdown_tables import tables

PASSING = "matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}\n"
FAILING = ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}, "
           "faults: [{kind: grad_scale, step: 1}]}\n")


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory, cache_dir):
    """One `parity run` of PASSING, with a GitHub step summary: what it printed and wrote is checked by the first
    test, and the later ones take its out dir as a shard and its record as a golden instead of running it again."""
    root = tmp_path_factory.mktemp("passing")
    (root / "passing.yaml").write_text(PASSING)
    step_summary, out = root / "step_summary.md", root / "out"
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as printed:
        patch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
        code = main(["run", str(root / "passing.yaml"), "--out", str(out), "--cache-dir", str(cache_dir)])
    return SimpleNamespace(code=code, printed=printed.getvalue(), out=out, step_summary=step_summary)


def test_run_writes_results_summary_and_step_summary(passing_run):
    out = passing_run.out
    assert passing_run.code == 0
    printed = passing_run.printed
    assert "[1/1] PASS  tiny-qwen3/fsdp2/dp2/fp32/cpu" in printed
    assert "1 scenarios in" in printed and "per-scenario overhead" in printed
    result = json.loads((out / "results.jsonl").read_text())
    assert {"id", "verdict", "reasons", "metrics"} <= result.keys()
    assert result["provenance"]["versions"]["torch"] and result["provenance"]["scenario_hash"]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    assert result["provenance"]["rank0_cpu_cores"] == (cores and cores[:max(1, len(cores) // 2)])
    summary = (out / "summary.md").read_text()
    assert "| tiny-qwen3/fsdp2/dp2/fp32/cpu" in summary and "| PASS" in summary
    assert passing_run.step_summary.read_text() == summary + "\n"
    found, stray = tables(summary)  # GitHub renders each of its tables (GFM table rule)
    assert stray == [] and len(found) == 3 and found[0][1][:2] == ["tiny-qwen3/fsdp2/dp2/fp32/cpu", "PASS"]
    record_dir = out / "records" / "tiny-qwen3__fsdp2__dp2__fp32__cpu"
    assert (record_dir / "record.json").is_file() and (record_dir / "tensors.safetensors").is_file()


def test_failure_exits_1_and_report_merges_shards(passing_run, write_yaml, tmp_path, cache_dir, capsys):
    shard_a, shard_b = passing_run.out, tmp_path / "b"
    assert main(["run", str(write_yaml(FAILING, "b.yaml")), "--out", str(shard_b), "--cache-dir",
                 str(cache_dir)]) == 1
    capsys.readouterr()
    merged = tmp_path / "merged"
    assert main(["report", str(shard_a), str(shard_b), "--out", str(merged)]) == 1
    printed = capsys.readouterr().out
    assert "FAIL tiny-qwen3/fsdp2/dp2/fp32/cpu+grad_scale" in printed
    assert "pre-clip grad norm rel diff at step 1 = 1 > limit 5" in printed  # rtol 5e-05 + atol
    assert len((merged / "results.jsonl").read_text().splitlines()) == 2
    assert "2 scenarios: 1 pass, 1 fail" in (merged / "summary.md").read_text()


def test_report_of_a_missing_dir_is_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "cannot read results" in capsys.readouterr().err


def test_list_prints_ids_with_marks_and_skip_reasons(capsys):
    assert main(["list", "scenarios/cpu.yaml", "scenarios/ascend_nightly.yaml", "--why"]) == 0
    printed = capsys.readouterr().out
    assert "tiny-qwen3/fsdp2/dp2/fp32/cpu  [nightly,pr]\n" in printed
    assert "qwen3-8b/fsdp2/dp8/bf16/npu  [nightly,npu]  SKIP: device npu: torch_npu is not installed" in printed


def test_k_expression_selects_ids(capsys):
    assert main(["list", "scenarios/cpu.yaml", "-k", "tiny-qwen3 and not moe and ulysses"]) == 0
    assert capsys.readouterr().out.splitlines() == ["tiny-qwen3/fsdp2/ulysses2/fp32/cpu  [nightly,pr]"]


def test_k_that_matches_nothing_is_bad_input(capsys):
    assert main(["run", "scenarios/cpu.yaml", "-k", "no-such-model"]) == 2
    assert "no scenario matches -k 'no-such-model'" in capsys.readouterr().err


def test_golden_and_single_rank_references(passing_run, write_yaml, tmp_path, cache_dir, capsys):
    """A record directory is a golden (how a GPU run becomes the reference of an NPU run); single_rank compares
    an engine with itself on one rank."""
    golden = passing_run.out / "records" / "tiny-qwen3__fsdp2__dp2__fp32__cpu"
    second = write_yaml(f"""
        defaults: {{model: tiny-qwen3, strategy: fsdp2}}
        matrix:
          - {{layout: {{ulysses: 2}}, reference: "golden:{golden}"}}
          - {{layout: {{dp: 2}}, reference: single_rank}}
    """, "second.yaml")
    assert main(["run", str(second), "--out", str(tmp_path / "second"), "--cache-dir", str(cache_dir)]) == 0
    lines = [json.loads(line) for line in (tmp_path / "second" / "results.jsonl").read_text().splitlines()]
    assert [r["verdict"] for r in lines] == ["PASS", "PASS"]
    assert lines[0]["warnings"] == [f"golden {golden} has no manifest.json: its content is not verified (goldens "
                                    "recorded with `parity golden record` are)"]
    assert lines[0]["reference"] == f"golden:{golden}" and lines[1]["reference"] == "single_rank"


def test_a_full_disk_mid_run_exits_2_naming_it_after_the_table_of_what_finished(write_yaml, tmp_path, cache_dir,
                                                                                monkeypatch, capsys):
    """The out dir takes no result (ENOSPC once the run is going): no traceback, the row on the terminal."""
    import errno

    from parity.reports import results

    def full(out_dir, result):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out_dir / "results.jsonl"))

    monkeypatch.setattr(results, "append", full)
    one = "matrix:\n  - {model: tiny-qwen3, strategy: hf, name: a}\n"
    assert main(["run", str(write_yaml(one)), "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir)]) == 2
    captured = capsys.readouterr()
    assert "cannot write the results" in captured.err and "No space left on device" in captured.err
    assert "tiny-qwen3/hf/single/fp32/cpu+a" in captured.out and "1 scenarios" in captured.out
    assert "Traceback" not in captured.err
