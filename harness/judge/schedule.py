"""The learning rate each step ran at, read back from the engine's optimizer, against the workload's schedule
(parity.harness.contract.schedule: verl's semantics as a function of the step), at every step and in every param
group: a warmup ignored shows at step 1, a scheduler stepped twice per update from step 2, a group the scheduler
never reaches wherever the schedule moves. An engine that reports no learning rate is not compared (its loss is)."""

from __future__ import annotations

import math

from parity.harness.contract.schedule import describe, lr_at
from parity.harness.contract.schema import Workload
from parity.harness.judge.checks import Check
from parity.harness.judge.tolerances import Limits
from parity.harness.run.records import RunRecord

METRIC = "learning rate vs the schedule"


def lr_checks(record: RunRecord, workload: Workload, limits: Limits, who: str = "") -> list[Check]:
    """One check per step that reports learning rates: the param group farthest from the schedule, its distance
    in units of the peak lr (`workload.lr`)."""
    checks = []
    for step in record.steps:
        if not step.lr:
            continue
        expected = lr_at(workload, step.step)
        distances = [abs(lr - expected) / workload.lr if math.isfinite(lr) else math.inf for lr in step.lr]
        group = max(range(len(distances)), key=lambda i: distances[i])
        where = f" in param group {group} of {len(step.lr)}" if len(step.lr) > 1 else ""
        checks.append(Check(f"{who}{METRIC}", distances[group], limits.lr_rel, step=step.step, lane="rel",
                            note=f"engine {step.lr[group]:.6g}{where}, schedule {expected:.6g} ({describe(workload)}); "
                                 "|Δ| / lr"))
    return checks


def schedule_series(record: RunRecord, workload: Workload) -> dict[str, list[float | None]]:
    """Per step: the lr the engine ran at (its first group's) and the schedule's, for the report's curves."""
    return {"lr": [step.lr[0] if step.lr else None for step in record.steps],
            "schedule_lr": [lr_at(workload, step.step) for step in record.steps]}
