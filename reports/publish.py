"""Everything that happens once a run ends (harness/session.py publishes through it; `parity report` too)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from parity.harness.config.paths import BISECT, RESULTS
from parity.reports import html
from parity.reports.early_figures import EarlyFigures
from parity.reports.markdown import append_step_summary, render, write_summary
from parity.reports.provenance import provenance as night_provenance
from parity.reports.terminal import print_report


def with_bisections(results: list[dict[str, Any]], out_dir: Path) -> list[dict[str, Any]]:
    """Rows with the first bad upstream commit `parity bisect --flipped` found for them (OUT/bisect.json), as
    `bisect` (its line); the rest as they are."""
    path = out_dir / BISECT
    try:
        found = json.loads(path.read_text()) if path.is_file() else []
    except ValueError:
        found = []
    lines = {b["scenario"]: b["line"] for b in found if isinstance(b, dict) and "scenario" in b and "line" in b}
    return [r | {"bisect": lines[r["id"]]} if r["id"] in lines else r for r in results]


def publish(out_dir: Path, results: list[dict[str, Any]], wall_s: float | None = None,
            stream: TextIO | None = None, page: bool = True, trends: dict[str, str] | None = None,
            drift: list[str] | None = None, early: EarlyFigures | None = None,
            history: tuple[Path, ...] = ()) -> Path:
    """Terminal table, OUT/summary.md, OUT/report.html (unless page=False), and $GITHUB_STEP_SUMMARY when set,
    each opening on what ran and (with `history`, earlier runs' out dirs) what changed since the latest of them.
    `early`: the figures the run drew as its results came. Returns the summary path. $PARITY_LANE (ci/nightly.sh
    exports its LANE) names the lane on the first screen where rows await a golden."""
    stream = stream or sys.stdout
    lane = os.environ.get("PARITY_LANE") or None
    results = with_bisections(results, out_dir)
    runs = None
    if history:
        from parity.reports.history import load_runs

        runs = load_runs(list(history))
    provenance = night_provenance(results, runs)
    print_report(results, wall_s, stream, provenance)
    text = render(results, wall_s, provenance=provenance, lane=lane)
    path = write_summary(out_dir, text)
    append_step_summary(text)
    where = f"summary: {path}  results: {out_dir / RESULTS}"
    if page:
        figures = early.figures(results) if early is not None else None
        side_files: dict[str, bytes] = {}
        page_html = html.render(results, wall_s, trends=trends, drift=drift, figures=figures, provenance=provenance,
                                side_files=side_files, lane=lane)
        where += f"  report: {html.write(out_dir, page_html, side_files)}"
    print(where, file=stream)
    return path
