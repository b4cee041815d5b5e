"""The reference cache refuses what it cannot trust and is safe under concurrent runs: an entry whose files do not
match their recorded sha256 is recomputed (with a warning naming it), and two processes asking for one absent
entry compute it once, the other loading the stored copy (harness/run/ref_cache.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from parity.harness.run import ref_cache
from parity.harness.run.records import RunRecord, StepRecord


def computes(directory: Path, log: Path, delay: float = 0.0):
    """A compute callback that saves a small record slowly, file by file, and logs each call."""

    def compute(where: Path) -> RunRecord:
        with log.open("a") as handle:
            handle.write("computed\n")
        record = RunRecord("ref", "h", "ok", steps=[StepRecord(1, 0.5, 2.0, 0.1)],
                           tensors={"logprobs_before": torch.full((2, 3), -1.5)})
        where.mkdir(parents=True)
        time.sleep(delay)  # a reader that does not wait would find this half-written
        record.save(where)
        return record

    return compute


def test_an_entry_is_reused_and_a_corrupt_one_is_recomputed_naming_it(tmp_path, capsys):
    entry, log = tmp_path / "refs" / "tiny-qwen3-abc", tmp_path / "calls"
    first = ref_cache.get_or_compute(entry, computes(entry, log))
    again = ref_cache.get_or_compute(entry, computes(entry, log))
    assert log.read_text().count("computed") == 1 and again.steps == first.steps
    tensors = entry / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the numbers: it still loads, as the wrong reference
    tensors.write_bytes(bytes(data))
    ref_cache.get_or_compute(entry, computes(entry, log))
    assert log.read_text().count("computed") == 2
    assert f"cached run {entry} cannot be trusted ({tensors} does not match its sha256" in capsys.readouterr().err
    (entry / "record.json").write_text('{"run_id": "ref", "sce')  # cut off mid-write
    ref_cache.get_or_compute(entry, computes(entry, log))
    assert log.read_text().count("computed") == 3 and "record.json does not match" in capsys.readouterr().err
    (entry / ref_cache.SUMS).unlink()  # an entry from before the sums: not trusted either
    ref_cache.get_or_compute(entry, computes(entry, log))
    assert log.read_text().count("computed") == 4


def _ask(entry: Path, log: Path, out: Path) -> None:
    record = ref_cache.get_or_compute(entry, computes(entry, log, delay=0.5))
    out.write_text(repr(record.steps))


@pytest.mark.parametrize("lock", [True, False])
def test_two_processes_compute_an_absent_entry_once(tmp_path, monkeypatch, lock):
    """With the lock removed (the injected defect) both compute: the check sees it."""
    if not lock:
        monkeypatch.setattr(ref_cache, "locked", lambda directory: contextlib.nullcontext())
    entry, log = tmp_path / "refs" / "tiny-qwen3-abc", tmp_path / "calls"
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_ask, args=(entry, log, tmp_path / f"out{i}")) for i in range(2)]
    for proc in procs:
        proc.start()
        time.sleep(0.1)  # the second asks while the first computes
    for proc in procs:
        proc.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert log.read_text().count("computed") == (1 if lock else 2)
    assert (tmp_path / "out0").read_text() == (tmp_path / "out1").read_text()
    if lock:  # the stored entry verifies, and no private directory is left behind
        assert ref_cache.problem(entry) is None and sorted(p.name for p in entry.parent.iterdir()) == [
            ".tiny-qwen3-abc.lock", "tiny-qwen3-abc"]


def test_the_cache_key_covers_the_code_that_determines_a_references_numbers():
    """The tiny-model builder and its weight seed (config/models.py), the rank's seeding (config/devices.py), the
    reference engine and the workload: found through the imports of the reference's modules, lazy ones too."""
    from parity.harness.judge.reference import REFERENCE_CODE, source_files

    found = {f"{path.parent.name}/{path.name}" for path in source_files(REFERENCE_CODE)}
    assert {"config/models.py", "config/devices.py", "hf/engine.py", "hf/common.py", "run/worker.py",
            "contract/workload.py", "reference/losses.py", "reference/optim.py"} <= found
    assert "reports/html.py" not in found  # what judges and reports is not what computes


def test_the_key_is_taken_from_the_sources_as_the_session_first_read_them(tmp_path):
    """A file edited after the session read it: the key still names what was read (what the forkserver imported),
    and changed() names the file, so the runner writes no entry (tests/multiproc/test_ref_cache_run.py)."""
    from parity.harness.judge.reference import REFERENCE_CODE, Sources, code_hash, source_files

    sources = Sources().snapshot(source_files(REFERENCE_CODE))
    assert sources.changed() == [] and code_hash(sources=sources) == code_hash()
    module = tmp_path / "builder.py"
    module.write_text("SEED = 1\n")
    first = sources.digest(module)
    module.write_text("SEED = 2\n")
    assert sources.digest(module) == first
    assert sources.changed() == [module]
