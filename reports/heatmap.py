"""The report's heat map of headroom: per dtype, engine layout (rows) x model (columns), each cell the worst check ÷
its limit of the scenarios there (fault twins and named variants share their layout's cell; the cell shows the
worst and names them all). Green is far under the limit, red past it; an ERROR is black, a SKIP grey. Layouts are
the rows because there are many of them (a page is taller than it is wide)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

from parity.reports.table import headroom

#: (upper bound of headroom, background, text colour): the first band a value falls in
BANDS = ((0.1, "#1e8449", "#fff"), (0.3, "#52be80", "#000"), (0.6, "#f7dc6f", "#000"), (1.0, "#f0b27a", "#000"),
         (math.inf, "#c0392b", "#fff"))
ERROR_COLOURS = ("#17202a", "#fff")
SKIP_COLOURS = ("#d5d8dc", "#000")


@dataclass(slots=True)
class Cell:
    results: list[dict[str, Any]] = field(default_factory=list)

    def worst(self) -> dict[str, Any]:
        """ERROR first, then the largest headroom (NaN as the largest), SKIP last."""
        def key(result: dict[str, Any]) -> tuple[int, float]:
            if result["verdict"] == "ERROR":
                return (2, 0.0)
            if result["verdict"] == "SKIP":
                return (0, 0.0)
            value = headroom(result)
            return (1, math.inf if value is None or math.isnan(value) else value)

        return max(self.results, key=key)


def grids(results: list[dict[str, Any]]) -> dict[str, tuple[list[str], list[str], dict[tuple[str, str], Cell]]]:
    """dtype -> (models, engine layouts, cells by (model, engine layout)), in the order they first appear."""
    out: dict[str, tuple[list[str], list[str], dict[tuple[str, str], Cell]]] = {}
    for result in results:
        parts = result["id"].split("/")
        model = parts[0]
        column = f"{result.get('strategy') or parts[1]} {result.get('layout') or parts[2]}"
        dtype = result.get("dtype") or (parts[3] if len(parts) > 3 else "-")
        rows, columns, cells = out.setdefault(dtype, ([], [], {}))
        if model not in rows:
            rows.append(model)
        if column not in columns:
            columns.append(column)
        cells.setdefault((model, column), Cell()).results.append(result)
    return out


def _colours(result: dict[str, Any]) -> tuple[str, str, str]:
    """(background, foreground, text) of a cell showing this result."""
    if result["verdict"] == "ERROR":
        return (*ERROR_COLOURS, "ERROR")
    if result["verdict"] == "SKIP":
        return (*SKIP_COLOURS, "skip")
    value = headroom(result)
    if value is None:
        return ("#fff", "#000", result["verdict"])
    if math.isnan(value):
        return ("#c0392b", "#fff", "nan")
    background, foreground = next((b, f) for limit, b, f in BANDS if value <= limit)
    if result["verdict"] == "FAIL" and value <= 1:  # failed on a check that is not a ratio (a dropped kwarg)
        background, foreground = "#c0392b", "#fff"
    return background, foreground, format(value, ".2g")


def render(results: list[dict[str, Any]], anchor: Any) -> str:
    """The heat maps, one table per dtype; each cell links to its worst scenario's section (`anchor(id)`)."""
    parts = []
    for dtype, (models, layouts, cells) in grids(results).items():
        head = "".join(f"<th>{html.escape(m)}</th>" for m in models)
        body = []
        for layout in layouts:
            tds = []
            for model in models:
                cell = cells.get((model, layout))
                if cell is None:
                    tds.append('<td class="empty"></td>')
                    continue
                shown = cell.worst()
                background, foreground, text = _colours(shown)
                more = f" +{len(cell.results) - 1}" if len(cell.results) > 1 else ""
                tip = "\n".join(f"{r['verdict']} {r['id']}" + (f" ({value:.3g})" if (value := headroom(r)) is not None
                                                                 else "") for r in cell.results)
                tds.append(f'<td class="cell" style="background:{background};color:{foreground}" '
                           f'title="{html.escape(tip)}" data-verdict="{html.escape(shown["verdict"])}">'
                           f'<a href="#{anchor(shown["id"])}" style="color:{foreground}">{html.escape(text)}</a>'
                           f'<small>{html.escape(more)}</small></td>')
            body.append(f'<tr><th class="text">{html.escape(layout)}</th>{"".join(tds)}</tr>')
        parts.append(f'<table class="heatmap" data-dtype="{html.escape(dtype)}"><caption>{html.escape(dtype)}'
                     f'</caption><thead><tr><th></th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    legend = " ".join(f'<span class="band" style="background:{b};color:{f}">≤ {limit:g}</span>'
                      for limit, b, f in BANDS[:-1])
    legend += (f' <span class="band" style="background:{BANDS[-1][1]};color:{BANDS[-1][2]}">&gt; 1 (fails)</span>'
               f' <span class="band" style="background:{ERROR_COLOURS[0]};color:{ERROR_COLOURS[1]}">ERROR</span>'
               f' <span class="band" style="background:{SKIP_COLOURS[0]}">skip</span>')
    return (f'<div id="heatmap"><h2>Headroom: worst check ÷ its limit</h2><p class="legend">{legend}</p>'
            f'<div id="heatmaps">{"".join(parts)}</div></div>')
