"""How the emulated NPU lane runs: `PARITY_MINDSPEED_SRC` names one MindSpeed source tree; the lane runs the harness
in a SUBPROCESS whose PYTHONPATH starts with the emulated torch_npu (site/) and that tree, so the ranks import the
real MindSpeed over the emulation while this pytest process, and every normal run, never has either on its path
(MindSpeed's adaptor patches torch and Megatron process-wide on import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parity.harness.config.paths import RECORD, record_dir

SRC_VAR = "PARITY_MINDSPEED_SRC"
REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "tests" / "emulated_npu" / "site"
SCENARIOS = REPO / "scenarios" / "emulated_npu.yaml"


def mindspeed_source() -> Path:
    """The tree the lane runs, or a SKIP naming the variable."""
    value = os.environ.get(SRC_VAR)
    if not value:
        pytest.skip(f"{SRC_VAR} is not set: point it at a MindSpeed source tree (a clone of "
                    "https://github.com/Ascend/MindSpeed at a pinned commit) to run the emulated NPU lane "
                    "(docs/ascend.md, 'The emulated lane')")
    src = Path(value).expanduser()
    if not (src / "mindspeed" / "__init__.py").is_file():
        pytest.fail(f"{SRC_VAR}={value} has no mindspeed/__init__.py: not a MindSpeed source tree")
    return src


def skip_on_bad_megatron_pairing(src: Path) -> None:
    """Runs that build mindspeed_megatron directly (not through a scenario's SKIP) need the megatron-core line the
    tree declares: a core_r0.16 tree with megatron-core 0.12, or master (0.12.1 line) with 0.16, SKIPs naming both."""
    from parity.engines.mindspeed.env import _setup_version, declared_pairing, megatron_core_version, pairing_problem

    readme = (src / "README.md").read_text(errors="replace") if (src / "README.md").is_file() else None
    pairing = declared_pairing(readme, _setup_version(src / "setup.py"))
    if pairing and (problem := pairing_problem(pairing.megatron, megatron_core_version(), str(src),
                                               pairing.declared_by)):
        pytest.skip(problem)


def lane_env(src: Path) -> dict[str, str]:
    paths = [str(SITE), str(src), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


def run_harness(args: list[str], src: Path, timeout_s: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=lane_env(src), capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def results(out: Path) -> dict[str, dict[str, Any]]:
    """id -> results.jsonl line, with the run's record.json (when one was written) under 'record'."""
    found = {}
    path = out / "results.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        record = record_dir(out, row["id"]) / RECORD
        row["record"] = json.loads(record.read_text()) if record.is_file() else None
        found[row["id"]] = row
    return found
