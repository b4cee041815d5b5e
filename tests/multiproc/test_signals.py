"""SIGTERM to `parity run` (either launcher) or to `pytest` mid-scenario: every process of the run is gone, the
finished scenarios and the interrupted one (ERROR) are in results.jsonl and summary.md, and the exit code is
128 + SIGTERM. The finished scenario is also the single-node run of each launcher (`--launcher torchrun`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds the run's processes through /proc")

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
KILLED = {"parity-run-forked-kill9": COMMANDS["parity-run-forked"]}
"""The same run killed with SIGKILL: no handler runs, the kernel's parent-death signal must end the ranks (the
forkserver's, and through it theirs; a torchrun launch arms the same signal in torchrun and in each worker)."""
COMMANDS |= KILLED


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    out: Path
    tag: str
    """PARITY_SIGNAL_TEST's value in the environment of everything this entry point started."""
    log: Path
    """Its stdout and stderr: a pipe nobody reads while another entry point is tested could fill and stall it."""

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory, cache_dir) -> Path:
    """One cache for every entry point, without the reference they all need: they start at once and compute it
    at once (the tiny checkpoint is copied in: its build has had its own lock all along)."""
    shared = tmp_path_factory.mktemp("shared-cache")
    shutil.copytree(cache_dir / "models", shared / "models")
    return shared


@pytest.fixture(scope="module")
def started(tmp_path_factory, shared_cache):
    """Every entry point started at once: each spends most of its time importing torch in fresh interpreters and
    waiting on its ranks, so they overlap instead of running one after the other; each test then signals its
    own once its ranks hang. They share one cache that lacks the reference all of them need."""
    cache_dir = shared_cache
    runs = {}
    for entry in sorted(COMMANDS):
        work = tmp_path_factory.mktemp(entry)
        (work / "s.yaml").write_text(SCENARIOS)
        out, tag = work / "out", uuid.uuid4().hex
        args = [a.format(out=out, cache=cache_dir) for a in COMMANDS[entry]]
        with (work / "output.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, *args], cwd=work, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PARITY_SIGNAL_TEST": tag})
        runs[entry] = Started(proc, out, tag, work / "output.log")
    yield runs
    for run in runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(timeout=30)


def test_runs_started_at_once_on_one_empty_cache_all_pass(started, shared_cache):
    """Five runs ask for one reference that is not in their cache, at once: one computes it under the entry's lock
    while the others wait and load it; every run's first row PASSes and the cache holds one verified entry."""
    from parity.harness.run import ref_cache

    for entry, run in started.items():
        results = run.out / "results.jsonl"
        assert wait_for(lambda r=results: r.is_file() and r.read_text().count("\n") >= 1, 240), run.output()
        first = json.loads(results.read_text().splitlines()[0])
        assert (first["id"], first["verdict"]) == ("tiny-qwen3/hf/single/fp32/cpu", "PASS"), (entry, first)
    entries = [p for p in (shared_cache / "refs").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and ref_cache.problem(entries[0]) is None
    assert not [p for p in (shared_cache / "refs").iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("entry", sorted(set(COMMANDS) - set(KILLED)))
def test_sigterm_kills_every_rank_and_reports_what_finished(started, entry):
    """Both launchers under `parity run`, and pytest (whose plugin installs the same handling)."""
    run = started[entry]
    proc, out, value = run.proc, run.out, run.tag
    hung = lambda: any("injected hang" in p.read_text(errors="replace")  # noqa: E731
                       for p in (out / "records").rglob("*.log"))
    assert wait_for(hung, 240), run.output()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, run.output()
    assert wait_for(lambda: not tagged_pids(value), 10), f"left behind: {tagged_pids(value)}"
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["verdict"]) for r in results] == [
        ("tiny-qwen3/hf/single/fp32/cpu", "PASS"), ("tiny-qwen3/fsdp2/dp2/fp32/cpu+hang", "ERROR")]
    assert results[1]["reasons"] == ["error while running: Interrupted: interrupted by SIGTERM"]
    assert "tiny-qwen3/fsdp2/dp2/fp32/cpu+hang" in (out / "summary.md").read_text()
    # the finished scenario ran under the launcher asked for (for torchrun: one torchrun on this node)
    launcher = "torchrun" if entry == "parity-run-torchrun" else "forked"
    assert results[0]["provenance"]["launcher"] == launcher


@pytest.mark.parametrize("entry", sorted(KILLED))
def test_kill_9_of_the_harness_leaves_no_rank_alive_within_5_s(started, entry):
    """SIGKILL runs no handler and no `finally`: the forked ranks die with the forkserver (which exits when the
    harness does), by the parent-death signal each arms."""
    run = started[entry]
    proc, out, value = run.proc, run.out, run.tag
    hung = lambda: any("injected hang" in p.read_text(errors="replace")  # noqa: E731
                       for p in (out / "records").rglob("*.log"))
    assert wait_for(hung, 240), run.output()
    assert len(tagged_pids(value)) >= 3  # the harness, its ranks (and forkserver / torchrun)
    proc.kill()
    proc.wait(timeout=30)
    assert wait_for(lambda: not tagged_pids(value), 5), f"left behind: {tagged_pids(value)}"
    finished = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["verdict"]) for r in finished] == [("tiny-qwen3/hf/single/fp32/cpu", "PASS")]
