"""Merging out dirs (`parity report DIR...`, the nightly's merged report): shards of one lane are one run, a later
line for the same row wins; the same row run on two upstream stacks (the nightly's verl lanes: verl's release and a
clone of its main branch) is two rows side by side, each id followed by its stack, so neither verdict is lost."""

from __future__ import annotations

import pytest

from parity.reports import results as results_file

pytestmark = pytest.mark.torch_free

ROW = "tiny-qwen3/verl_fsdp/dp2/fp32/cpu+packed+rlstep-grpo"
RELEASE = {"verl": {"version": "0.9.1", "source": "installed package", "commit": None}}
MAIN = {"verl": {"version": "0.10.0.dev", "source": "/runner/verl-main", "commit": "1dda039b9c"}}


def _dir(tmp_path, name, *rows):
    for row_id, verdict, provenance in rows:
        results_file.append(tmp_path / name, {"id": row_id, "verdict": verdict, "provenance": provenance})
    return tmp_path / name


def test_two_stacks_of_one_row_are_kept_side_by_side(tmp_path):
    release = _dir(tmp_path, "verl", (ROW, "PASS", RELEASE), ("other", "PASS", RELEASE))
    main = _dir(tmp_path, "verl-main", (ROW, "FAIL", MAIN), ("other", "PASS", MAIN))
    merged = {r["id"]: r["verdict"] for r in results_file.load([release, main])}
    assert merged == {f"{ROW} [verl 0.9.1]": "PASS", f"{ROW} [verl 0.10.0.dev tree]": "FAIL",
                      "other [verl 0.9.1]": "PASS", "other [verl 0.10.0.dev tree]": "PASS"}


def test_shards_of_one_stack_are_one_run_and_a_later_line_wins(tmp_path):
    first = _dir(tmp_path, "shard-1", (ROW, "ERROR", RELEASE), ("skipped", "SKIP", {}))
    second = _dir(tmp_path, "shard-2", (ROW, "PASS", RELEASE), ("skipped", "SKIP", {}))
    assert [(r["id"], r["verdict"]) for r in results_file.load([first, second])] == [(ROW, "PASS"),
                                                                                     ("skipped", "SKIP")]
