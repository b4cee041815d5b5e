"""Runs that go through the engine's own checkpoint: a `resume` scenario is launched in two parts — the first k
steps and a save, then FRESH processes (possibly on another layout) that load the checkpoint and train the rest —
and merged into one record, next to the same engine's uninterrupted run; a `convert` scenario saves after its last
step and scores the converted HF checkpoint (harness/run/worker.py Stage)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from parity.harness.config import paths
from parity.harness.contract.schema import Scenario
from parity.harness.run.records import RunRecord
from parity.harness.run.worker import Stage

#: launch(scenario, run_id, record_dir, stage) -> its record (Runner.execute)
Launch = Callable[[Scenario, str, Path, Stage | None], RunRecord]


def checkpointed_run(launch: Launch, scenario: Scenario, record_dir: Path) -> tuple[RunRecord, RunRecord | None]:
    """The candidate record of a resume / convert scenario, and for a resume the uninterrupted run's record (None
    otherwise). A part that fails is returned as the candidate (the run ERRORs naming it)."""
    for stale in record_dir.glob(paths.CHECKPOINTS):  # an earlier run's: a save never lands in another's files
        shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(record_dir / paths.CONVERTED_HF, ignore_errors=True)
    convert_to = str(record_dir / paths.CONVERTED_HF) if scenario.convert else None
    final = str(paths.checkpoint_dir(record_dir)) if scenario.convert else None
    first_part, second_part, whole_part = paths.STAGE_PARTS
    if scenario.resume is None:
        whole = launch(scenario, scenario.id, record_dir, Stage(save_to=final, convert_to=convert_to))
        return whole, None
    after = scenario.resume.after
    saved = paths.checkpoint_dir(record_dir, after)
    first = launch(scenario, f"{scenario.id}@steps1-{after}", record_dir / first_part,
                   Stage(last_step=after, save_to=str(saved)))
    if not first.ok:
        return _named(first, f"steps 1-{after} (before the checkpoint)"), None
    continued = scenario.model_copy(update={"layout": scenario.resume_layout})
    second = launch(continued, f"{scenario.id}@steps{after + 1}-", record_dir / second_part,
                    Stage(first_step=after + 1, load_from=str(saved), save_to=final, convert_to=convert_to))
    if not second.ok:
        return _named(second, f"steps {after + 1}-{scenario.workload.steps} (resumed from the checkpoint)"), None
    plain = scenario.model_copy(update={"resume": None, "convert": False})
    uninterrupted = launch(plain, f"{scenario.id}@uninterrupted", record_dir / whole_part, None)
    if not uninterrupted.ok:
        return _named(uninterrupted, "the uninterrupted run"), None
    return merged(first, second), uninterrupted


def _named(record: RunRecord, part: str) -> RunRecord:
    return replace(record, error=f"{part}: {record.error}")


def merged(first: RunRecord, second: RunRecord) -> RunRecord:
    """One record of the whole resumed run: steps of both parts, the forward before training (and its fingerprint)
    from the first, after
    it (and the converted checkpoint's) from the second, and the optimizer's step count as the resumed optimizer
    reads it back (a state not restored counts only the second part's steps)."""
    tensors = {key: value for key, value in first.tensors.items() if key.endswith("_before")}
    tensors |= {key: value for key, value in second.tensors.items() if not key.endswith("_before")}
    return replace(
        second, run_id=first.run_id.split("@")[0], steps=[*first.steps, *second.steps], tensors=tensors,
        forward_time_s=first.forward_time_s, applied_kwargs=first.applied_kwargs, fingerprint=first.fingerprint,
        peak_memory_bytes=max(first.peak_memory_bytes, second.peak_memory_bytes),
        peak_memory_per_rank=[max(a, b) for a, b in zip(first.peak_memory_per_rank, second.peak_memory_per_rank,
                                                         strict=False)] or second.peak_memory_per_rank,
        provenance={**second.provenance, "resumed": {"after_step": first.steps[-1].step if first.steps else 0,
                                                     "first_part": first.provenance.get("world_size")}},
        wall_time_s=first.wall_time_s + second.wall_time_s, compute_time_s=first.compute_time_s + second.compute_time_s)
