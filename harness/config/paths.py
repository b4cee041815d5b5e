"""Where a run's files go, named once: the out dir (`--out`), each run's record directory in it, and the reference
cache (`--cache-dir`). Every module that writes or reads these files takes the names from here.

    OUT/results.jsonl            one line per scenario, appended as each finishes (parity.reports.results)
    OUT/summary.md               the markdown report (also appended to $GITHUB_STEP_SUMMARY)
    OUT/report.html              the one-file HTML report
    OUT/records/<slug>/          one run: record.json, tensors.safetensors, job.json, and the rank logs and
                                 markers the run layer writes there (harness/run/worker.py)
    OUT/records/<slug>/part1/, part2/, uninterrupted/, checkpoint_step<k>/, checkpoint_final/, converted_hf/
                                 a run through the engine's own checkpoint (harness/run/staged.py): its parts'
                                 records, the engine's checkpoints and the HF checkpoint converted from the last
    OUT/gw<N>/                   a pytest-xdist worker's own out dir, merged into OUT when the session ends
    CACHE/refs/<slug>-<key>/     a cached reference or baseline run (the same files as a record directory)

A record directory is also a golden (`reference: golden:DIR`); a golden set is one directory of them named by slug.
"""

from __future__ import annotations

from pathlib import Path

OUT = Path("parity-out")
"""The default --out."""
CACHE = Path(".parity-cache")
"""The default --cache-dir."""
RESULTS = "results.jsonl"
BISECT = "bisect.json"
"""OUT/bisect.json: `parity bisect --flipped`'s answers for the run's rows (the reports show them)."""
SUMMARY = "summary.md"
REPORT = "report.html"
RECORDS = "records"
RECORD = "record.json"
TENSORS = "tensors.safetensors"
RECORD_FILES = (RECORD, TENSORS)
"""What a run's record is (rank logs and markers lie beside them): a golden hashes them, the cache stores them."""
JOB = "job.json"
"""The job a torchrun launch hands its ranks."""
WORKER_SHARDS = "gw*"
"""pytest-xdist workers' out dirs under OUT (gw0, gw1, ...)."""
REFERENCES = "refs"
STAGE_PARTS = ("part1", "part2", "uninterrupted")
"""A resumed run's records: the steps before the save, the steps resumed from it, the run without a save."""
CHECKPOINTS = "checkpoint_*"
CONVERTED_HF = "converted_hf"


def checkpoint_dir(record: Path, step: int | None = None) -> Path:
    """The engine's checkpoint a staged run saves after `step` (None: after its last step, for conversion)."""
    return record / ("checkpoint_final" if step is None else f"checkpoint_step{step}")


def slug(run_id: str) -> str:
    """A run id as a directory name (OUT/records/<slug>, golden sets, cached references)."""
    return run_id.replace("/", "__").replace(":", "_")


def record_dir(out_dir: Path, run_id: str) -> Path:
    return out_dir / RECORDS / slug(run_id)


def reference_dir(cache_dir: Path, run_id: str, key: str) -> Path:
    return cache_dir / REFERENCES / f"{slug(run_id)}-{key}"

