"""SIGTERM to `pytest` mid-scenario, as to `parity run`: every process of the run is gone, the finished scenario
and the interrupted one (ERROR) are in results.jsonl and summary.md, and pytest exits with 128 + SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.multiproc.test_signals import SCENARIOS, tagged_pids, wait_for


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the run's processes through /proc")
def test_sigterm_under_pytest_kills_every_rank_and_reports_what_finished(tmp_path, cache_dir):
    (tmp_path / "s.yaml").write_text(SCENARIOS)
    out, tag = tmp_path / "out", f"PARITY_SIGNAL_TEST={uuid.uuid4().hex}"
    name, value = tag.split("=")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "s.yaml",
                             f"--parity-out={out}", f"--parity-cache-dir={cache_dir}"], cwd=tmp_path,
                            env={**os.environ, name: value}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        hung = lambda: any("injected hang" in p.read_text(errors="replace")  # noqa: E731
                           for p in (out / "records").rglob("*.log"))
        assert wait_for(hung, 240), proc.communicate(timeout=5)[0].decode()[-3000:]
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert wait_for(lambda: not tagged_pids(value), 10), f"left behind: {tagged_pids(value)}"
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["verdict"]) for r in results] == [
        ("tiny-qwen3/hf/single/fp32/cpu", "PASS"), ("tiny-qwen3/fsdp2/dp2/fp32/cpu+hang", "ERROR")]
    assert results[1]["reasons"] == ["error while running: Interrupted: interrupted by SIGTERM"]
    assert "tiny-qwen3/fsdp2/dp2/fp32/cpu+hang" in (out / "summary.md").read_text()
