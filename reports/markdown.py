"""summary.md and the GitHub step summary: the headline table, why each non-PASS row is what it is, the SKIPs
grouped by reason, then the detail tables (errors; speed and memory) and the strategies side by side."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from parity.harness.config.paths import SUMMARY
from parity.reports.pivot import strategy_pivot
from parity.reports.table import (
    ERRORS,
    SPEED,
    overhead_line,
    parity_table,
    reasons_block,
    skip_groups,
    summary_line,
)


def render(results: list[dict[str, Any]], wall_s: float | None = None, title: str = "Parity results") -> str:
    lines = [f"## {title}", "", summary_line(results, wall_s), ""]
    if overhead := overhead_line(results):
        lines += [overhead, ""]
    if any(r["verdict"] != "SKIP" for r in results):
        lines += [parity_table(results), ""]
    details = reasons_block(results)
    if details:
        lines += ["### Not passing", ""]
        for run_id, verdict, reasons in details:
            lines.append(f"- **{verdict}** `{run_id}`")
            lines += [f"  - {reason}" for reason in reasons[:8]]
        lines.append("")
    if skipped := skip_groups(results):
        lines += ["### Skipped", ""]
        for reason, ids in skipped:
            lines.append(f"- **{len(ids)} SKIP**: {reason}")
            lines.append(f"  <details><summary>which</summary>{html.escape(', '.join(ids))}</details>")
        lines.append("")
    if any(r["verdict"] != "SKIP" for r in results):
        lines += ["### Errors against the reference", "", parity_table(results, ERRORS), "",
                  "### Speed and memory", "", parity_table(results, SPEED), ""]
    pivot = strategy_pivot(results)
    if pivot:
        lines += ["### Max |Δ log-prob| vs reference, strategies side by side", "", pivot, ""]
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
