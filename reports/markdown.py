"""summary.md and the GitHub step summary, built for triage: the verdict counts, what ran and what changed since the
previous night, then each non-PASS row with its reasons (an ERROR with its first-dying rank's log), the SKIPs grouped
by reason, and the long tables (every row; errors; speed and memory; strategies side by side) folded in
`<details>` so the page opens on what needs a reviewer."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.harness.config.paths import SUMMARY
from parity.reports.pivot import strategy_pivot
from parity.reports.table import (
    ERRORS,
    SPEED,
    counts,
    no_golden,
    no_golden_line,
    overhead_line,
    parity_table,
    reasons_block,
    skip_groups,
    summary_line,
)
from parity.reports.triage import REASONS_SHOWN, cut, log_lines, where_line

if TYPE_CHECKING:
    from parity.reports.provenance import Provenance

BADGES = (("PASS", "✅"), ("FAIL", "❌"), ("ERROR", "💥"), ("SKIP", "⏭️"))


def badge_line(results: list[dict[str, Any]]) -> str:
    tally = counts(results)
    return " · ".join(f"{mark} **{tally.get(verdict, 0)}** {verdict.lower()}" for verdict, mark in BADGES)


def _folded(summary: str, body: str) -> list[str]:
    """A block GitHub shows folded; the blank lines let the markdown inside render as markdown."""
    return [f"<details><summary>{html.escape(summary)}</summary>", "", body, "", "</details>", ""]


def render(results: list[dict[str, Any]], wall_s: float | None = None, title: str = "Parity results",
           provenance: Provenance | None = None, lane: str | None = None) -> str:
    """`lane`: the nightly lane the results are of, named where rows await a golden."""
    lines = [f"## {title}", ""]
    if missing := no_golden(results):  # first: such a night ran less than it shows, and is not green
        lines += [f"> ⛔ **{no_golden_line(len(missing), lane)}**", ""]
    lines += [badge_line(results), "", summary_line(results, wall_s), ""]
    if provenance is not None:
        lines += [f"- {line.strip()}" for line in provenance.lines()] + [""]
    by_id = {r["id"]: r for r in results}
    if details := reasons_block(results):
        lines += ["### Not passing", ""]
        for run_id, verdict, reasons in details:
            lines.append(f"- **{verdict}** `{run_id}`")
            if where := where_line(by_id[run_id]):
                lines.append(f"  - **where:** {where}")
            lines += [f"  - {reason}" for reason in cut(reasons, REASONS_SHOWN)]
            if verdict == "ERROR" and (log := log_lines(by_id[run_id])):
                lines.append(f"  - {log[0]}")
                if log[1:]:
                    lines += ["", "    ```", *(f"    {line}" for line in log[1:]), "    ```", ""]
        lines.append("")
    if skipped := skip_groups(results):
        lines += ["### Skipped", ""]
        for reason, ids in skipped:
            lines.append(f"- **{len(ids)} SKIP**: {reason}")
            lines.append(f"  <details><summary>which</summary>{html.escape(', '.join(ids))}</details>")
        lines.append("")
    ran = [r for r in results if r["verdict"] != "SKIP"]
    if ran:
        lines += _folded(f"Every row that ran ({len(ran)})", parity_table(results))
        lines += _folded("Errors against the reference", parity_table(results, ERRORS))
        lines += _folded("Speed and memory", parity_table(results, SPEED))
    if overhead := overhead_line(results):
        lines += [overhead, ""]
    if pivot := strategy_pivot(results):
        lines += _folded("Max |Δ log-prob| vs reference, strategies side by side", pivot)
    return "\n".join(lines)


def write_summary(out_dir: Path, text: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SUMMARY
    path.write_text(text)
    return path


def append_step_summary(text: str) -> bool:
    """Append to $GITHUB_STEP_SUMMARY when running under GitHub Actions."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    with open(target, "a") as handle:
        handle.write(text + "\n")
    return True
