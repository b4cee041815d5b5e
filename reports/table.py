"""The parity table (tabulate), shared by the terminal, summary.md and the GitHub step summary."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from tabulate import tabulate

HEADERS = ["id", "strategy", "layout", "dtype", "device", "reference", "logp max|Δ|", "logp mean|Δ|",
           "loss rel (worst)", "gnorm rel (worst)", "step s", "verdict"]


def _num(value: Any, fmt: str = ".2e") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _reference(result: dict[str, Any]) -> str:
    ref = result.get("reference") or "-"
    return f"{ref} ÷ {result['baseline']}-{result.get('dtype')}" if result.get("baseline") else ref


def row(result: dict[str, Any]) -> list[str]:
    m = result.get("metrics") or {}
    return [result["id"], result.get("strategy", "-"), result.get("layout", "-"), result.get("dtype", "-"),
            result.get("device", "-"), _reference(result), _num(m.get("logprob_max_abs")),
            _num(m.get("logprob_mean_abs")), _num(m.get("loss_rel_max")), _num(m.get("grad_norm_rel_max")),
            _num(m.get("step_time_s"), ".3f"), result["verdict"]]


def parity_table(results: list[dict[str, Any]], fmt: str = "github") -> str:
    return tabulate([row(r) for r in results], headers=HEADERS, tablefmt=fmt, disable_numparse=True)


def reasons_block(results: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(id, verdict, reasons) for everything that did not pass."""
    return [(r["id"], r["verdict"], r.get("reasons") or []) for r in results if r["verdict"] != "PASS"]


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
