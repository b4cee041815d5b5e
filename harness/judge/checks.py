"""One check of a verdict: a metric, its observed value and its limit (the reason text a FAIL prints)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    metric: str
    observed: float
    limit: float
    step: int | None = None
    lane: str = "abs"
    """abs (vs fp32 reference), rel (relative), ratio (candidate error / baseline error), baseline (vs the
    same-recipe baseline), self (the candidate against its own other reading)."""
    note: str = ""
    """How the limit was formed, when it is not a plain number (rtol + atol / |ref|)."""
    update: int | None = None
    """Which optimizer update of `step`, where a step takes several (Workload.updates_per_step)."""

    @property
    def passed(self) -> bool:
        return self.observed <= self.limit  # NaN/inf never pass

    def reason(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        at += f", update {self.update}" if self.update is not None else ""
        how = f"; {self.note}" if self.note else ""
        return f"{self.metric}{at} = {self.observed:.3g} > limit {self.limit:.3g} ({self.lane}{how})"


def failing_or_worst(checks: list[Check]) -> list[Check]:
    """The failing checks of a family (one per module, one per step), else its worst passing one, so that a report
    shows the margin without listing every module."""
    failing = [c for c in checks if not c.passed]
    return failing or ([max(checks, key=lambda c: c.observed / c.limit)] if checks else [])
