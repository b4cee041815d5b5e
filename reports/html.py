"""report.html: one self-contained page (inline CSS, script and base64 PNG, nothing fetched) that a reviewer opens
from the CI artifact: the summary table (sortable, coloured by verdict), each scenario's plots, the error across
layouts side by side, and trends over earlier runs when a history is given."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from parity.reports import plots
from parity.reports.table import COLUMNS, FULL, reasons_block, summary_line

REPORT = "report.html"

STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #eee; cursor: pointer; position: sticky; top: 0; }
td.text { text-align: left; }
tr.PASS td.verdict { background: #c8efc8; } tr.FAIL td.verdict { background: #f5b7b1; }
tr.ERROR td.verdict { background: #f8c471; } tr.SKIP td.verdict { background: #e5e7e9; }
tr.WARN td.verdict { background: #f9e79f; }
section { margin: 1.5em 0; border-top: 1px solid #ddd; }
img { max-width: 100%; }
.reason { color: #a93226; font-family: monospace; }
"""

# Clicking a header sorts by its column (numbers as numbers, '-' last); the body's data-ready says the script ran
# to its end (the browser test reads it), data-script-error holds the first error if one was thrown.
SCRIPT = """
window.addEventListener("error", function (e) { document.body.dataset.scriptError = e.message; });
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows), dir = th.dataset.dir === "asc" ? -1 : 1;
      th.dataset.dir = dir === 1 ? "asc" : "desc";
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v, nx = parseFloat(x), ny = parseFloat(y);
        if (x === "") return 1; if (y === "") return -1;
        return dir * (isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
document.body.dataset.ready = "1";
"""


def anchor(run_id: str) -> str:
    return "s-" + "".join(c if c.isalnum() else "-" for c in run_id)


def _cell(header: str, result: dict[str, Any]) -> str:
    column = COLUMNS[header]
    raw = column.value(result)
    sort = "" if raw is None or (isinstance(raw, float) and math.isnan(raw)) else str(raw)
    text = html.escape(column.text(result))
    if header == "id":
        text = f'<a href="#{anchor(result["id"])}">{text}</a>'
    kind = "verdict" if header == "verdict" else ("text" if not column.fmt else "num")
    return f'<td class="{kind}" data-v="{html.escape(sort)}">{text}</td>'


def summary_table(results: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in FULL)
    rows = "\n".join(f'<tr class="{html.escape(r["verdict"])}" data-id="{html.escape(r["id"])}">'
                     + "".join(_cell(h, r) for h in FULL) + "</tr>" for r in results)
    return f'<table class="sortable" id="summary"><thead><tr>{head}</tr></thead><tbody>\n{rows}\n</tbody></table>'


def _img(png: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'


def scenario_section(result: dict[str, Any], trend: str | None = None, figure: str | None = None) -> str:
    reasons = {run_id: why for run_id, _, why in reasons_block([result])}.get(result["id"], [])
    parts = [f'<section id="{anchor(result["id"])}" data-id="{html.escape(result["id"])}">',
             f'<h3>{html.escape(result["verdict"])} {html.escape(result["id"])}</h3>']
    parts += [f'<div class="reason">{html.escape(reason)}</div>' for reason in reasons]
    if figure is not None:
        parts.append(_img(figure, f"{result['id']}: loss, grad norm, |Δ log-prob|"))
    if trend:
        parts.append(_img(trend, f"{result['id']}: trend over earlier runs"))
    parts.append("</section>")
    return "\n".join(parts)


def layouts_section(results: list[dict[str, Any]]) -> str:
    """Per (model, dtype): max |Δ log-prob| of every strategy and layout (no fault twins, no named variants)."""
    groups: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        value = (r.get("metrics") or {}).get("logprob_max_abs")
        if value is None or r.get("faults") or r.get("name") or math.isnan(value):
            continue
        groups.setdefault((r["id"].split("/", 1)[0], r.get("dtype", "-")), {})[
            f"{r.get('strategy')} {r.get('layout')}"] = value
    figures = [_img(plots.layouts_figure(model, dtype, values), f"{model} {dtype} across layouts")
               for (model, dtype), values in groups.items() if len(values) > 1]
    return "<h2>Error across layouts</h2>\n" + "\n".join(figures) if figures else ""


def render(results: list[dict[str, Any]], wall_s: float | None = None, title: str = "Parity results",
           trends: dict[str, str] | None = None, drift: list[str] | None = None,
           figures: list[str | None] | None = None) -> str:
    """The page. `trends`: run id -> trend PNG; `drift`: one line per flagged change (reports/history.py);
    `figures`: each result's scenario figure when drawn already (reports/early_figures.py), else drawn here."""
    trends = trends or {}
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(summary_line(results, wall_s))}</p>",
            summary_table(results)]
    if drift:
        body += ["<h2>Changes over history</h2>", "<ul>",
                 *(f'<li class="reason">{html.escape(line)}</li>' for line in drift), "</ul>"]
    body.append(layouts_section(results))
    body.append("<h2>Scenarios</h2>")
    figures = plots.scenario_figures(results) if figures is None else figures
    body += [scenario_section(r, trends.get(r["id"]), figure) for r, figure in zip(results, figures, strict=True)]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def write(out_dir: Path, page: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT
    path.write_text(page, encoding="utf-8")
    return path
