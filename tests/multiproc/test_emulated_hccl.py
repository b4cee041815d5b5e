"""The emulated HCCL group (tests/emulated_npu/site/torch_npu/_hccl.py) and `device: npu` rows on CPU under the emulated
torch_npu with PARITY_EMULATED_NPU_CARDS (the nightly's Ascend path rehearsed on CPU, docs/ascend.md "Emulated cards
and HCCL"). Only the site is on the ranks' path (no MindSpeed); every check has its planted input and clean twin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

SITE = REPO / "tests" / "emulated_npu" / "site"


def _env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join([str(SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PARITY_EMULATED_NPU_CARDS": "8",
            "PARITY_CARD_LOCK_DIR": str(tmp_path / "cards"), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("hccl")
    done = subprocess.run([sys.executable, str(REPO / "tests" / "emulated_npu" / "hccl_probe.py"),
                           str(work / "out.json")], env=_env(work), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((work / "out.json").read_text())


@pytest.mark.parametrize(("planted", "clean"), [
    ("all_reduce/float64", "all_reduce/float32"),
    ("all_reduce/bool", "all_reduce/int8"),
    ("all_reduce/prod/bfloat16", "all_reduce/bfloat16"),
    ("all_reduce/prod/int16", "all_reduce/prod/float32"),
    ("all_reduce/band/int32", "all_reduce/max/int32"),
    ("reduce_scatter/float64", "reduce_scatter/float32"),
    ("all_gather/uint16", "all_gather/float64"),
    ("functional/float64", "functional/float32"),
    ("gather", "all_gather_object"),
])
def test_hccl_refuses_what_hccl_refuses_and_gives_gloos_results_otherwise(probe, planted, clean):
    assert probe["backend"] == "hccl"
    assert probe[planted].get("refused") == "HcclRefused", probe[planted]
    _, _, dtype = planted.partition("/")
    message = probe[planted]["message"]
    assert "emulated HCCL" in message and "CANN HCCL API reference" in message, message
    if dtype and "/" not in dtype:  # the dtype is named (prod / band cases name theirs too)
        assert dtype in message, message
    assert "refused" not in probe[clean], probe[clean]
    assert probe[clean]["hccl"] == probe[clean]["gloo"], probe[clean]


ROWS = """
description: a float64 collective on a device row (tests/multiproc/test_emulated_hccl.py)
defaults: {device: npu, dtype: fp32, model: tiny-qwen3, layout: {dp: 2}, timeout: 300,
           workload: {batch_size: 4, prompt_len: 16, response_len: 16, steps: 2}}
matrix:
  - {strategy: fsdp2, name: clean}
  - {engine: "tests.emulated_npu.planted_hccl:Float64NormFSDP2Engine", name: float64}
  - {engine: "tests.emulated_npu.planted_hccl:Float64NormFSDP2Engine", device: cpu, name: gloo}
"""


def _run(args: list[str], tmp_path: Path) -> dict[str, dict[str, Any]]:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "parity.harness.cli", "run", *args, "--out", str(out)], cwd=REPO,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600, check=False)
    path = out / "results.jsonl"
    assert path.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_a_float64_collective_in_an_engine_errors_a_device_row(tmp_path):
    (tmp_path / "rows.yaml").write_text(textwrap.dedent(ROWS))
    found = {k.split("+")[-1]: v for k, v in _run([str(tmp_path / "rows.yaml")], tmp_path).items()}
    assert set(found) == {"clean", "float64", "gloo"}, sorted(found)
    assert found["clean"]["verdict"] == "PASS", found["clean"]["reasons"]
    assert found["float64"]["verdict"] == "ERROR", found["float64"]
    reason = " ".join(found["float64"]["reasons"])
    assert "HcclRefused" in reason and "allreduce" in reason and "float64" in reason, reason
    # the same engine on gloo runs: the refusal is the HCCL group's, as on the device
    assert found["gloo"]["verdict"] == "PASS", found["gloo"]["reasons"]


def test_the_nightlys_fsdp2_smoke_row_runs_on_emulated_cards(tmp_path):
    """scenarios/ascend_nightly.yaml's fsdp2 dp2 smoke row (bf16 against the HF master-weights baseline, hccl,
    Emulated-NPU cards): it ERRORed on the float64 all-reduce of engines/fsdp2/tensor_parallel.py before the fix."""
    rows = _run([str(REPO / "scenarios" / "ascend_nightly.yaml"), "-k", "tiny-qwen3/fsdp2/dp2/bf16"], tmp_path)
    (row,) = rows.values()
    assert row["verdict"] == "PASS", row["reasons"]
