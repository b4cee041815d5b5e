"""SIGTERM to `parity run` (either launcher) or to `pytest` mid-scenario: every process of the run is gone, the
finished scenarios and the interrupted one (ERROR) are in results.jsonl and summary.md, and the exit code is
128 + SIGTERM. The finished scenario is also the single-node run of each launcher (`--launcher torchrun`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SCENARIOS = """\
defaults: {device: cpu, timeout: 300}
matrix:
  - {model: tiny-qwen3, strategy: hf}
  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}, faults: [{kind: hang, step: 1}]}
"""


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries the tag: the harness and everything it started (ranks, torchrun,
    forkserver, resource tracker), whichever session they moved to."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if tag.encode() in (proc / "environ").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


#: how each entry point is started on the scenario file (cwd = its directory); `{out}` / `{cache}` are filled in
COMMANDS = {
    "parity-run-forked": ["-m", "parity.harness.cli", "run", "s.yaml", "--out", "{out}", "--cache-dir", "{cache}",
                          "--launcher", "forked"],
    "parity-run-torchrun": ["-m", "parity.harness.cli", "run", "s.yaml", "--out", "{out}", "--cache-dir", "{cache}",
                            "--launcher", "torchrun"],
    "pytest": ["-m", "pytest", "-q", "-p", "no:cacheprovider", "s.yaml", "--parity-out={out}",
               "--parity-cache-dir={cache}"],
}


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the run's processes through /proc")
@pytest.mark.parametrize("entry", sorted(COMMANDS))
def test_sigterm_kills_every_rank_and_reports_what_finished(tmp_path, cache_dir, entry):
    """Both launchers under `parity run`, and pytest (whose plugin installs the same handling)."""
    (tmp_path / "s.yaml").write_text(SCENARIOS)
    out, tag = tmp_path / "out", f"PARITY_SIGNAL_TEST={uuid.uuid4().hex}"
    name, value = tag.split("=")
    args = [a.format(out=out, cache=cache_dir) for a in COMMANDS[entry]]
    proc = subprocess.Popen([sys.executable, *args], cwd=tmp_path, env={**os.environ, name: value},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
    # the finished scenario ran under the launcher asked for (for torchrun: one torchrun on this node)
    launcher = "torchrun" if entry == "parity-run-torchrun" else "forked"
    assert results[0]["provenance"]["launcher"] == launcher
