"""`parity history`: per-scenario trends over earlier runs' results and the change points in them (error grown,
slowdown, memory growth), each naming the first run at the new level and what changed in its provenance."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.harness.config.paths import RESULTS
from parity.harness.judge.drift import ABS_FLOOR, METRICS, Change, MatrixChange, Metric, flag_changes, matrix_changes
from parity.reports import results as results_file

IGNORED_PROVENANCE = ("started",)
"""Provenance keys that differ on every run."""


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    results: dict[str, dict[str, Any]]
    written: str = ""
    """When its results file was last written (ISO): orders a run whose rows carry no start time."""

    @property
    def started(self) -> str:
        """The earliest start among its rows (every row carries one, SKIP and ERROR too); else `written`."""
        times = [str((r.get("provenance") or {}).get("started") or "") for r in self.results.values()]
        return min((t for t in times if t), default=self.written)


@dataclass(frozen=True, slots=True)
class Flag:
    run_id: str
    metric: Metric
    change: Change
    run: str
    """Label of the first run at the new level (where a creep starts)."""
    provenance: list[str]
    """What differs in that run's provenance from the run before it."""

    def line(self) -> str:
        changed = "; ".join(self.provenance) or "nothing in its provenance"
        c = self.change
        if c.kind == "creep":
            return (f"{self.metric.kind} (creep): {self.run_id} {self.metric.label} {c.relative:+.1%} over "
                    f"{c.runs} runs from {self.run} ({c.before:.4g} -> {c.after:.4g}; p = {c.p:.2g})")
        return (f"{self.metric.kind}: {self.run_id} {self.metric.label} {c.relative:+.1%} "
                f"({c.before:.4g} -> {c.after:.4g}; p = {c.p:.2g}) first in {self.run}; changed: {changed}")


@dataclass(frozen=True, slots=True)
class MatrixFlag:
    change: MatrixChange
    run: str
    """Label of the night the matrix moved."""
    provenance: list[str]
    """What differs in that night's provenance from the night before, over the rows of both (the first row that
    has any difference)."""

    def line(self) -> str:
        c = self.change
        changed = "; ".join(self.provenance) or "nothing in its provenance"
        return (f"{c.metric.kind} across the matrix: {c.metric.label} {c.relative:+.1%} (median over {c.scenarios} "
                f"scenarios; {c.worse} moved worse, {c.better} better; p = {c.p:.2g}) in {self.run}; "
                f"changed: {changed}")


def load_runs(directories: list[Path]) -> list[Run]:
    """One Run per directory, oldest first (by the earliest `started` of its rows, else when its results file was
    written; ties keep the order given)."""
    runs = []
    for d in directories:
        path = d / RESULTS if d.is_dir() else d
        written = ""
        if path.is_file():
            written = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds")
        runs.append(Run(d.name if d.is_dir() else d.parent.name,
                        {r["id"]: r for r in results_file.load([d])}, written))
    return chronological(runs)


def chronological(runs: list[Run]) -> list[Run]:
    """Oldest first, by Run.started (ties keep the order given)."""
    return sorted(runs, key=lambda run: run.started)


def _value(result: dict[str, Any] | None, key: str) -> float | None:
    if result is None or result.get("verdict") in ("ERROR", "SKIP"):
        return None
    value = (result.get("metrics") or {}).get(key)
    return float(value) if isinstance(value, int | float) and not math.isnan(value) else None


def series(runs: list[Run], run_id: str) -> dict[str, list[float | None]]:
    return {m.key: [_value(run.results.get(run_id), m.key) for run in runs] for m in METRICS}


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        elif key not in IGNORED_PROVENANCE:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def provenance_diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    old, new = _flat(before), _flat(after)
    return [f"{key} {old.get(key, '-')} -> {new.get(key, '-')}" for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)]


def detect(runs: list[Run]) -> list[Flag]:
    """Flagged changes over every scenario and metric of the history, at drift.FDR_Q false discovery rate over all
    of them."""
    ids = list(dict.fromkeys(run_id for run in runs for run_id in run.results))
    series_of = {(run_id, metric.key): (values, metric) for run_id in ids
                 for metric, values in zip(METRICS, series(runs, run_id).values(), strict=True)}
    flags = []
    for key, changes in flag_changes(series_of).items():
        run_id, metric = key[0], series_of[key][1]
        for change in changes:
            previous = next((runs[i].results[run_id] for i in range(change.index - 1, -1, -1)
                             if run_id in runs[i].results), {})
            diff = provenance_diff(previous.get("provenance") or {},
                                   runs[change.index].results[run_id].get("provenance") or {})
            flags.append(Flag(run_id, metric, change, runs[change.index].label, diff))
    return flags


def detect_matrix(runs: list[Run]) -> list[MatrixFlag]:
    """Nights on which most scenarios moved the same way (drift.matrix_changes), one flag per night and metric."""
    ids = list(dict.fromkeys(run_id for run in runs for run_id in run.results))
    series_of = {(run_id, metric.key): (values, metric) for run_id in ids
                 for metric, values in zip(METRICS, series(runs, run_id).values(), strict=True)}
    flags = []
    for change in matrix_changes(series_of):
        night, before = runs[change.index], runs[change.index - 1]
        diff = next((d for run_id in night.results if run_id in before.results
                     and (d := provenance_diff(before.results[run_id].get("provenance") or {},
                                               night.results[run_id].get("provenance") or {}))), [])
        flags.append(MatrixFlag(change, night.label, diff))
    return flags


def trend_table(runs: list[Run]) -> list[list[str]]:
    """Per scenario: the latest value of each metric and its change against the median of the runs before."""
    rows = []
    for run_id in dict.fromkeys(run_id for run in runs for run_id in run.results):
        row = [run_id, str(sum(run_id in run.results for run in runs))]
        for values in series(runs, run_id).values():
            known = [v for v in values if v is not None]
            if not known:
                row.append("-")
                continue
            cell = f"{known[-1]:.3g}"
            if len(known) > 1:
                median = statistics.median(known[:-1])
                cell += f" ({(known[-1] - median) / max(abs(median), ABS_FLOOR):+.0%})"
            row.append(cell)
        rows.append(row)
    return rows


HEADERS = ["id", "runs", *(m.label for m in METRICS)]


def trend_figures(runs: list[Run], flags: list[Flag]) -> dict[str, str]:
    """Run id -> trend PNG (one panel per metric, the flagged run marked)."""
    from parity.reports.plots import trend_figure

    labels = [run.label for run in runs]
    figures = {}
    for run_id in dict.fromkeys(run_id for run in runs for run_id in run.results):
        by_label = {m.label: values for m, values in zip(METRICS, series(runs, run_id).values(), strict=True)}
        flagged = {f.metric.label: f.change.index for f in flags if f.run_id == run_id}
        figures[run_id] = trend_figure(run_id, labels, by_label, flagged)
    return figures


def changes_since(earlier: list[Run], current: list[dict[str, Any]], label: str = "this run") -> list[str]:
    """What a reviewer should know about this run against the history: verdicts that moved since the latest
    earlier run, scenarios new or gone, and the changes the history rule flags in this run (detect over the
    earlier runs and this one)."""
    if not earlier:
        return []
    previous = earlier[-1]
    now = {r["id"]: r for r in current}
    lines = []
    for run_id, result in now.items():
        before = previous.results.get(run_id)
        if before is None:
            lines.append(f"new: {run_id} ({result['verdict']})")
        elif before["verdict"] != result["verdict"]:
            lines.append(f"{before['verdict']} -> {result['verdict']}: {run_id}")
    lines += [f"gone: {run_id} (was {previous.results[run_id]['verdict']})" for run_id in previous.results
              if run_id not in now]
    runs = [*earlier, Run(label, now)]
    lines += [flag.line() for flag in [*detect_matrix(runs), *detect(runs)] if flag.run == label]
    return [f"since {previous.label}: " + line for line in lines] if lines else [f"since {previous.label}: none"]
