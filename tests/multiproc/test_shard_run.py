"""`parity run --shard I/N` on a small matrix: shards 1/2 + 2/2 are the whole matrix, and `parity report` over
them gives the same rows as an unsharded run; `pytest --parity-shard I/N` splits the collected scenarios."""

from __future__ import annotations

import json

import pytest

from parity.harness.cli import main
from parity.reports.table import row

MATRIX = """matrix:
  - {model: tiny-qwen3, strategy: hf, name: a}
  - {model: tiny-qwen3, strategy: hf, name: b}
  - {model: tiny-qwen3, strategy: hf, name: c}
  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}
"""
COMPARED = ["id", "strategy", "layout", "Δlogp max", "Δlogp mean", "loss rel", "gnorm rel", "verdict"]
"""Every column but timings and memory, which differ from run to run."""


def rows(directory) -> dict[str, list[str]]:
    results = map(json.loads, (directory / "results.jsonl").read_text().splitlines())
    return {r["id"]: row(r, COMPARED) for r in results}


# sharding serves the nightly's multi-worker lanes, which run this (the merge of shard out dirs by `parity report`
# stays in .ci/run: test_cli.py test_failure_exits_1_and_report_merges_shards)
@pytest.mark.nightly
def test_two_shards_merge_into_the_unsharded_rows(write_yaml, tmp_path, cache_dir, capsys):
    matrix = str(write_yaml(MATRIX))
    common = ["--cache-dir", str(cache_dir)]
    assert main(["run", matrix, "--out", str(tmp_path / "full"), *common]) == 0
    for i in (1, 2):
        assert main(["run", matrix, "--shard", f"{i}/2", "--out", str(tmp_path / f"shard{i}"), *common]) == 0
    printed = capsys.readouterr().out
    assert "shard 1/2: 2 of 4 scenarios" in printed and "shard 2/2: 2 of 4 scenarios" in printed
    one, two = rows(tmp_path / "shard1"), rows(tmp_path / "shard2")
    assert not one.keys() & two.keys()
    assert main(["report", str(tmp_path / "shard1"), str(tmp_path / "shard2"), "--out", str(tmp_path / "merged"),
                 "--html"]) == 0
    assert rows(tmp_path / "merged") == rows(tmp_path / "full")
    assert (tmp_path / "merged" / "report.html").is_file()


SHARDED = """matrix:
  - {model: [tiny-llama, tiny-qwen2, tiny-qwen3], strategy: fsdp2, layout: [{dp: 2}, {tp: 2}], marks: [nightly]}
"""


def test_pytest_parity_shard_collects_each_scenario_in_one_shard(pytester):
    pytester.makefile(".yaml", **{"scenarios/cpu": SHARDED})
    collected = []
    for shard in ("1/2", "2/2"):
        result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", "--parity-shard",
                                              shard)
        collected.append({line for line in result.outlines if "::" in line})
        result.assert_outcomes(deselected=3)
    assert len(collected[0]) == len(collected[1]) == 3 and not collected[0] & collected[1]
    bad = pytester.runpytest_inprocess("--collect-only", "-q", "--parity-shard", "3/2")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR and "expected I/N" in bad.stderr.str()
