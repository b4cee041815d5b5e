"""The parity table's columns, once: every metric for summary.md, the step summary and the HTML page; a narrow
subset for the terminal."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tabulate import tabulate


def _num(value: Any, fmt: str = ".2e") -> str:
    """'-' for a metric that was not measured, 'nan' for one that was and is NaN (a NaN is a result, not a gap)."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, fmt)


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]
    """The raw value (a number sorts as a number in the HTML page)."""
    fmt: str = ""
    """format() spec for numbers; '' for text."""

    def text(self, result: dict[str, Any]) -> str:
        value = self.value(result)
        return _num(value, self.fmt) if self.fmt else str(value if value is not None else "-")


def _metric(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda result: (result.get("metrics") or {}).get(key)


def _vs_reference(result: dict[str, Any]) -> Any:
    return ((result.get("metrics") or {}).get("vs_reference") or {}).get("tokens_per_s")


def _info(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda result: result.get(key) or "-"


def _reference(result: dict[str, Any]) -> str:
    ref = result.get("reference") or "-"
    return f"{ref} ÷ {result['baseline']}-{result.get('dtype')}" if result.get("baseline") else ref


COLUMNS = {column.header: column for column in (
    Column("id", lambda r: r["id"]), Column("strategy", _info("strategy")), Column("layout", _info("layout")),
    Column("dtype", _info("dtype")), Column("device", _info("device")), Column("reference", _reference),
    Column("logp max|Δ|", _metric("logprob_max_abs"), ".2e"),
    Column("logp mean|Δ|", _metric("logprob_mean_abs"), ".2e"),
    Column("loss rel", _metric("loss_rel_max"), ".1e"), Column("gnorm rel", _metric("grad_norm_rel_max"), ".1e"),
    Column("tok/s", _metric("tokens_per_s"), ".0f"), Column("step s", _metric("step_time_s"), ".3f"),
    Column("± s", _metric("step_time_spread_s"), ".3f"), Column("fwd s", _metric("forward_time_s"), ".3f"),
    Column("peak MB", _metric("peak_memory_mb"), ".0f"), Column("MFU", _metric("mfu"), ".1%"),
    Column("tok/s ÷ ref", _vs_reference, ".2f"), Column("verdict", lambda r: r["verdict"]))}
FULL = list(COLUMNS)
"""summary.md, the step summary and the HTML page: every metric (loss / gnorm rel = worst step)."""
NARROW = ["id", "logp max|Δ|", "loss rel", "gnorm rel", "tok/s", "step s", "peak MB", "verdict"]
"""The terminal: what fits 120 columns; strategy, layout, dtype and device are in the id."""


def row(result: dict[str, Any], headers: list[str] = FULL) -> list[str]:
    return [COLUMNS[h].text(result) for h in headers]


def parity_table(results: list[dict[str, Any]], fmt: str = "github", headers: list[str] = FULL) -> str:
    return tabulate([row(r, headers) for r in results], headers=headers, tablefmt=fmt, disable_numparse=True)


def narrow_table(results: list[dict[str, Any]], width: int = 120) -> str:
    """The terminal table within `width` columns: ids too long for it are shortened in the middle."""
    rows = [row(r, NARROW) for r in results]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(NARROW)]
    room = max(width - sum(widths[1:]) - 2 * (len(NARROW) - 1), 20)
    for r in rows:
        if len(r[0]) > room:
            keep = room - 1
            r[0] = r[0][: keep - keep // 2] + "…" + r[0][len(r[0]) - keep // 2:]
    widths[0] = min(widths[0], room)
    lines = [NARROW, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def reasons_block(results: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(id, verdict, reasons) for everything that did not pass, then (id, 'WARN', warnings) for passes with perf
    warnings."""
    rows = [(r["id"], r["verdict"], r.get("reasons") or []) for r in results if r["verdict"] != "PASS"]
    return rows + [(r["id"], "WARN", r["warnings"]) for r in results if r["verdict"] == "PASS" and r.get("warnings")]


def counts(results: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["verdict"] for r in results)


def overhead_line(results: list[dict[str, Any]]) -> str:
    """Per-scenario launch overhead: wall time seen by the parent minus compute time inside the ranks."""
    pairs = [(m["wall_time_s"], m["compute_time_s"]) for r in results if (m := r.get("metrics"))
             and m.get("wall_time_s") and m.get("compute_time_s")]
    if not pairs:
        return ""
    overhead = [w - c for w, c in pairs]
    return (f"per-scenario overhead (launch + collect, outside compute): mean {sum(overhead) / len(overhead):.2f} s, "
            f"max {max(overhead):.2f} s over {len(pairs)} runs")


def summary_line(results: list[dict[str, Any]], wall_s: float | None = None) -> str:
    c = counts(results)
    parts = [f"{c.get(s, 0)} {s.lower()}" for s in ("PASS", "FAIL", "ERROR", "SKIP")]
    wall = f" in {wall_s:.1f} s" if wall_s is not None else ""
    return f"{len(results)} scenarios{wall}: " + ", ".join(parts)
