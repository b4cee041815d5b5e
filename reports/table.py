"""The parity tables' columns, once: a narrow headline (id, verdict, worst error ÷ limit, speed), detail tables of
errors and of speed and memory, every column for the HTML page, and what fits a terminal.

Markdown tables are GitHub-flavoured: a `|` inside a header or a cell is escaped, or GitHub drops the whole table
(a header with more cells than its delimiter row is not a table)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from parity.harness.config.validate import GOLDENS_WORKFLOW, NO_GOLDEN

#: the order non-passing verdicts are listed in (worst first); PASS last
SEVERITY = {"ERROR": 0, "FAIL": 1, "PASS": 2, "SKIP": 3}


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


def _check_ratio(check: dict[str, Any]) -> float:
    """observed ÷ limit of one stored check: NaN for a NaN observation, inf over a zero limit."""
    observed, limit = check.get("observed"), check.get("limit")
    if not isinstance(observed, int | float) or not isinstance(limit, int | float):
        return math.nan
    if math.isnan(observed) or math.isnan(limit):
        return math.nan
    if limit <= 0:
        return math.inf if observed > 0 else 0.0
    return observed / limit


def _nan_last(value: float) -> float:
    return math.inf if math.isnan(value) else value


def worst_check(result: dict[str, Any]) -> dict[str, Any] | None:
    """The check nearest (or furthest past) its limit: the row's headroom. None when nothing was checked."""
    checks = result.get("checks") or []
    return max(checks, key=lambda c: _nan_last(_check_ratio(c))) if checks else None


def headroom(result: dict[str, Any]) -> float | None:
    """Worst observed ÷ limit over the row's checks (> 1 fails; NaN when a checked value was NaN)."""
    check = worst_check(result)
    return None if check is None else _check_ratio(check)


def _worst_label(result: dict[str, Any]) -> str | None:
    check = worst_check(result)
    if check is None:
        return None
    at = f" @ step {check['step']}" if check.get("step") is not None else ""
    return check["metric"] + at + (f", update {check['update']}" if check.get("update") is not None else "")


COLUMNS = {column.header: column for column in (
    Column("id", lambda r: r["id"]), Column("verdict", lambda r: r["verdict"]),
    Column("worst ÷ limit", headroom, ".3g"), Column("worst check", _worst_label),
    Column("strategy", _info("strategy")), Column("layout", _info("layout")),
    Column("dtype", _info("dtype")), Column("device", _info("device")), Column("reference", _reference),
    Column("Δlogp max", _metric("logprob_max_abs"), ".2e"),
    Column("Δlogp mean", _metric("logprob_mean_abs"), ".2e"),
    Column("loss rel", _metric("loss_rel_max"), ".1e"), Column("gnorm rel", _metric("grad_norm_rel_max"), ".1e"),
    Column("tok/s", _metric("tokens_per_s"), ".0f"), Column("step s", _metric("step_time_s"), ".3f"),
    Column("± s", _metric("step_time_spread_s"), ".3f"), Column("timed steps", _metric("steady_steps"), "d"),
    Column("fwd s", _metric("forward_time_s"), ".3f"),
    Column("peak MB", _metric("peak_memory_mb"), ".0f"), Column("MFU", _metric("mfu"), ".1%"),
    Column("tok/s ÷ ref", _vs_reference, ".2f"))}
FULL = list(COLUMNS)
"""The HTML page: every column (loss / gnorm rel = worst step); the verdict second, so it is never off-screen."""
HEADLINE = ["id", "verdict", "worst ÷ limit", "step s", "tok/s"]
"""summary.md and the step summary open on this: one narrow row per scenario that ran."""
ERRORS = ["id", "reference", "worst check", "Δlogp max", "Δlogp mean", "loss rel", "gnorm rel"]
SPEED = ["id", "tok/s", "step s", "± s", "timed steps", "fwd s", "peak MB", "MFU", "tok/s ÷ ref"]
NARROW = ["id", "worst ÷ limit", "Δlogp max", "loss rel", "gnorm rel", "tok/s", "step s", "peak MB", "verdict"]
"""The terminal: what fits 120 columns; strategy, layout, dtype and device are in the id."""


def row(result: dict[str, Any], headers: list[str] = FULL) -> list[str]:
    return [COLUMNS[h].text(result) for h in headers]


def gfm_cell(text: str) -> str:
    """A table cell's text for GitHub markdown: pipes escaped, line breaks flattened."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[list[str]], headers: list[str]) -> str:
    """A GitHub-flavoured markdown table whatever the cells hold."""
    return tabulate([[gfm_cell(c) for c in r] for r in rows], headers=[gfm_cell(h) for h in headers],
                    tablefmt="github", disable_numparse=True)


def ran(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that ran (not SKIP), worst verdict first, in their order otherwise."""
    return sorted((r for r in results if r["verdict"] != "SKIP"), key=lambda r: SEVERITY.get(r["verdict"], 0))


def parity_table(results: list[dict[str, Any]], headers: list[str] = HEADLINE) -> str:
    return markdown_table([row(r, headers) for r in ran(results)], headers)


def narrow_table(results: list[dict[str, Any]], width: int = 120) -> str:
    """The terminal table within `width` columns: ids too long for it are shortened in the middle."""
    rows = [row(r, NARROW) for r in ran(results)]
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
    """(id, verdict, reasons) for every FAIL / ERROR (errors first), then (id, 'WARN', warnings) for passes with
    warnings. SKIPs are grouped by reason instead (skip_groups)."""
    rows = [(r["id"], r["verdict"], r.get("reasons") or []) for r in ran(results) if r["verdict"] != "PASS"]
    return rows + [(r["id"], "WARN", r["warnings"]) for r in results if r["verdict"] == "PASS" and r.get("warnings")]


def skip_groups(results: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """(reason, ids) per distinct SKIP reason, the most common first."""
    groups: dict[str, list[str]] = {}
    for r in results:
        if r["verdict"] == "SKIP":
            groups.setdefault("; ".join(r.get("reasons") or []) or "no reason given", []).append(r["id"])
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def no_golden(results: list[dict[str, Any]]) -> list[str]:
    """Ids of the rows that did not run because their golden is absent: SKIP, or ERROR under --require."""
    return [r["id"] for r in results if r["verdict"] in ("SKIP", "ERROR")
            and any(f"{NO_GOLDEN}: " in reason for reason in r.get("reasons") or [])]


def no_golden_line(count: int, lane: str | None = None) -> str:
    """What a night whose goldens are absent says first (the reports' first screen, ci/nightly.sh's failure)."""
    rows = f"{count} row{'' if count == 1 else 's'}" + (f" of lane {lane}" if lane else "")
    return f"{NO_GOLDEN}: {rows} not run; record with {GOLDENS_WORKFLOW} and pin PARITY_GOLDENS_TAG"


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
