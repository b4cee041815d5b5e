"""ci/smoke_gate.py: a stack's strict and big lanes run only when THAT stack's smoke leg passed. Planted: a failing,
an erroring and a missing smoke leg each stop the gate naming why; the clean twin (every row PASS, a broken row's
SKIP aside) opens it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_free

GATE = Path(__file__).resolve().parents[2] / "ci" / "smoke_gate.py"
CLEAN = [{"id": "tiny-qwen3/fsdp2/dp2/bf16/npu", "verdict": "PASS", "reasons": []},
         {"id": "tiny-qwen3/mindspeed_megatron/cp2/bf16/npu", "verdict": "SKIP", "reasons": ["broken: upstream"]}]


def gate(tmp_path: Path, rows: list[dict] | None) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "smoke-core012"
    folder.mkdir()
    if rows is not None:
        (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return subprocess.run([sys.executable, str(GATE), str(folder), "core012"], capture_output=True, text=True,
                          check=False)


def test_a_passing_smoke_leg_opens_its_stacks_gate(tmp_path):
    done = gate(tmp_path, CLEAN)
    assert done.returncode == 0, done.stdout
    assert "smoke (core012) passed" in done.stdout


@pytest.mark.parametrize(("rows", "named"), [
    ([*CLEAN, {"id": "tiny-qwen3-moe/x", "verdict": "FAIL", "reasons": ["grad norm"]}], "tiny-qwen3-moe/x: FAIL"),
    ([{"id": "a", "verdict": "ERROR", "reasons": ["rank 1 died"]}], "a: ERROR (rank 1 died)"),
    ([{"id": "b", "verdict": "SKIP", "reasons": ["torch_npu does not import"]}], "b: SKIP"),
    (None, "ended before it ran its rows"),
    ([], "wrote no rows"),
])
def test_a_smoke_leg_that_did_not_pass_closes_its_stacks_gate(tmp_path, rows, named):
    done = gate(tmp_path, rows)
    assert done.returncode == 1, done.stdout
    assert named in done.stdout
    assert "this stack's lanes do not run" in done.stdout
