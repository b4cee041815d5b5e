"""Terminal output: one progress line per finished scenario, then what ran and what changed since the previous
night, the narrow table (full metrics are in the files), the reasons (an ERROR's rank log with them), and one line
per SKIP reason."""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING, Any, TextIO

from parity.reports.table import narrow_table, overhead_line, reasons_block, skip_groups, summary_line
from parity.reports.triage import REASONS_SHOWN, cut, log_lines, where_line

if TYPE_CHECKING:
    from parity.reports.provenance import Provenance


def progress_line(index: int, total: int, result: dict[str, Any]) -> str:
    m = result.get("metrics") or {}
    timing = f" {m['wall_time_s']:.1f}s" if m.get("wall_time_s") else ""
    first = (result.get("reasons") or [""])[0]
    detail = f" — {first}" if result["verdict"] != "PASS" and first else ""
    return f"[{index}/{total}] {result['verdict']:<5} {result['id']}{timing}{detail}"


def print_report(results: list[dict[str, Any]], wall_s: float | None = None, stream: TextIO | None = None,
                 provenance: Provenance | None = None) -> None:
    stream = stream or sys.stdout
    print("", file=stream)
    if provenance is not None:
        for line in provenance.lines():
            print(line, file=stream)
        print("", file=stream)
    if any(r["verdict"] != "SKIP" for r in results):
        print(narrow_table(results, shutil.get_terminal_size((120, 24)).columns), file=stream)
        print("", file=stream)
    by_id = {r["id"]: r for r in results}
    for run_id, verdict, reasons in reasons_block(results):
        print(f"{verdict} {run_id}", file=stream)
        if where := where_line(by_id.get(run_id, {})):
            print(f"    where: {where}", file=stream)
        for reason in cut(reasons, REASONS_SHOWN):
            print(f"    {reason}", file=stream)
        if verdict == "ERROR":
            for line in log_lines(by_id[run_id]):
                print(f"    | {line}", file=stream)
    for reason, ids in skip_groups(results):
        named = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        print(f"SKIP x{len(ids)}: {reason} ({named})", file=stream)
    if overhead := overhead_line(results):
        print(overhead, file=stream)
    print(summary_line(results, wall_s), file=stream)
