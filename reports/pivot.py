"""Cross-strategy view: one row per (model, dtype), one column per strategy/layout, cells = max |Δ log-prob|."""

from __future__ import annotations

from typing import Any

from parity.reports.table import markdown_table


def strategy_pivot(results: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str], dict[str, str]] = {}
    columns: list[str] = []
    for result in results:
        value = (result.get("metrics") or {}).get("logprob_max_abs")
        if value is None or result.get("faults") or result.get("name"):  # fault twins and variants stay out
            continue
        model = result["id"].split("/", 1)[0]
        # a packed row beside the padded one of the same layout (same rows, same reference)
        packed = " packed" if result.get("packing") == "packed" else ""
        column = f"{result.get('strategy')} {result.get('layout')}{packed}"
        if column not in columns:
            columns.append(column)
        cells.setdefault((model, result.get("dtype", "-")), {})[column] = f"{value:.1e} {result['verdict'][0]}"
    if len({c.split()[0] for c in columns}) < 2:
        return ""
    rows = [[model, dtype, *(cells[(model, dtype)].get(c, "") for c in columns)] for (model, dtype) in cells]
    return markdown_table(rows, ["model", "dtype", *columns])
