"""report.html: one self-contained page (inline CSS, script and base64 PNG, nothing fetched) that a reviewer opens
from the CI artifact. It opens on a summary: verdict counts, what did not pass with its reasons (each a link to its
section), a heat map of headroom (worst check ÷ its limit) per model and engine layout, what changed since the
previous run when a history is given, and the SKIPs grouped by reason; then every row (sortable, the verdict
second), and each scenario's plots, worst first."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from parity.harness.config.paths import REPORT
from parity.reports import heatmap, plots
from parity.reports.table import (
    COLUMNS,
    FULL,
    SEVERITY,
    counts,
    reasons_block,
    skip_groups,
    summary_line,
)

STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #eee; }
table.sortable th { cursor: pointer; position: sticky; top: 0; }
td.text, th.text { text-align: left; }
td.id { max-width: 28em; overflow: hidden; text-overflow: ellipsis; text-align: left; }
tr.PASS td.verdict { background: #c8efc8; } tr.FAIL td.verdict { background: #f5b7b1; }
tr.ERROR td.verdict { background: #f8c471; } tr.SKIP td.verdict { background: #e5e7e9; }
tr.WARN td.verdict { background: #f9e79f; }
section { margin: 1.5em 0; border-top: 1px solid #ddd; }
div.wide { overflow-x: auto; }
img { max-width: 100%; }
.reason { color: #a93226; font-family: monospace; }
#overview { display: grid; grid-template-columns: minmax(24em, 1fr) auto; gap: 0 2em; align-items: start; }
#counts { grid-column: 1 / -1; display: flex; gap: 0.6em; align-items: center; flex-wrap: wrap; }
#heatmap { grid-column: 2; grid-row: 2 / span 20; }
#heatmaps { display: flex; flex-direction: column; gap: 0.5em; }
.count { font-size: 20px; font-weight: 600; padding: 0.2em 0.7em; border-radius: 4px; }
.count.PASS { background: #c8efc8; } .count.FAIL { background: #f5b7b1; } .count.ERROR { background: #f8c471; }
.count.SKIP { background: #e5e7e9; } .count.WARN { background: #f9e79f; }
#failures ul, #changes ul { margin: 0.3em 0; padding-left: 1.2em; }
#failures li { margin: 0.2em 0; }
table.heatmap { margin: 0.4em 0 0.8em; }
table.heatmap caption { text-align: left; font-weight: 600; }
table.heatmap td.cell a { text-decoration: none; font-weight: 600; }
table.heatmap td.cell small { margin-left: 0.3em; }
.band { padding: 0 0.4em; border-radius: 3px; }
details summary { cursor: pointer; font-weight: 600; }
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
        text = f'<a href="#{anchor(result["id"])}" title="{text}">{text}</a>'
    kind = {"verdict": "verdict", "id": "id"}.get(header, "text" if not column.fmt else "num")
    return f'<td class="{kind}" data-v="{html.escape(sort)}">{text}</td>'


def ordered(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worst verdict first (ERROR, FAIL, PASS, SKIP), each group in its run order."""
    return sorted(results, key=lambda r: SEVERITY.get(r["verdict"], 0))


def summary_table(results: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in FULL)
    rows = "\n".join(f'<tr class="{html.escape(r["verdict"])}" data-id="{html.escape(r["id"])}">'
                     + "".join(_cell(h, r) for h in FULL) + "</tr>" for r in ordered(results))
    return (f'<div class="wide"><table class="sortable" id="summary"><thead><tr>{head}</tr></thead><tbody>\n{rows}'
            "\n</tbody></table></div>")


def overview(results: list[dict[str, Any]], wall_s: float | None, changes: list[str] | None) -> str:
    """The top of the page: verdict counts, what did not pass (each a link to its section) with its first reasons,
    the heat map of headroom, what changed since the previous run, and the SKIPs grouped by reason."""
    tally = counts(results)
    warned = sum(1 for r in results if r["verdict"] == "PASS" and r.get("warnings"))
    badges = "".join(f'<span class="count {v}" data-verdict="{v}">{tally.get(v, 0)} {v}</span>'
                     for v in ("FAIL", "ERROR", "PASS", "SKIP"))
    if warned:
        badges += f'<span class="count WARN" data-verdict="WARN">{warned} WARN</span>'
    parts = [f'<div id="counts">{badges}<span>{html.escape(summary_line(results, wall_s))}</span></div>']
    items = []
    for run_id, verdict, reasons in reasons_block(results):
        first = "".join(f'<div class="reason">{html.escape(reason)}</div>' for reason in reasons[:2])
        more = f"<div>… {len(reasons) - 2} more</div>" if len(reasons) > 2 else ""
        items.append(f'<li data-verdict="{verdict}"><a href="#{anchor(run_id)}"><b>{verdict}</b> '
                     f'{html.escape(run_id)}</a>{first}{more}</li>')
    parts.append('<div id="failures"><h2>Not passing</h2>'
                 + (f"<ul>{''.join(items)}</ul>" if items else "<p>nothing: every scenario that ran passed</p>")
                 + "</div>")
    if changes is not None:
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in changes) or "<li>nothing changed</li>"
        parts.append(f'<div id="changes"><h2>Changes since the previous run</h2><ul>{lines}</ul></div>')
    if skipped := skip_groups(results):
        groups = "".join(f"<li><b>{len(ids)}</b> {html.escape(reason)}<br><small>{html.escape(', '.join(ids))}"
                         "</small></li>" for reason, ids in skipped)
        total = sum(len(ids) for _, ids in skipped)
        parts.append(f'<div id="skipped"><details><summary>{total} skipped, {len(skipped)} reason(s)</summary>'
                     f"<ul>{groups}</ul></details></div>")
    parts.append(heatmap.render([r for r in results if r["verdict"] != "SKIP"], anchor))
    return '<div id="overview">' + "\n".join(parts) + "</div>"


def _img(png: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'


def scenario_section(result: dict[str, Any], trend: str | None = None, figure: str | None = None) -> str:
    reasons = {run_id: why for run_id, _, why in reasons_block([result])}.get(result["id"], [])
    parts = [f'<section id="{anchor(result["id"])}" data-id="{html.escape(result["id"])}">',
             f'<h3>{html.escape(result["verdict"])} {html.escape(result["id"])}</h3>']
    parts += [f'<div class="reason">{html.escape(reason)}</div>' for reason in reasons]
    if figure is not None:
        parts.append(_img(figure, f"{result['id']}: loss, grad norm, their differences against the band, learning "
                                  "rate, |Δ log-prob|"))
    if trend:
        parts.append(_img(trend, f"{result['id']}: trend over earlier runs"))
    parts.append("</section>")
    return "\n".join(parts)


def render(results: list[dict[str, Any]], wall_s: float | None = None, title: str = "Parity results",
           trends: dict[str, str] | None = None, drift: list[str] | None = None,
           figures: list[str | None] | None = None, changes: list[str] | None = None) -> str:
    """The page. `trends`: run id -> trend PNG; `drift`: one line per flagged change (reports/history.py);
    `figures`: each result's scenario figure when drawn already (reports/early_figures.py), else drawn here;
    `changes`: what changed since the previous run (reports/history.changes_since), shown when not None."""
    trends = trends or {}
    body = [f"<h1>{html.escape(title)}</h1>", overview(results, wall_s, changes)]
    if drift:
        body += ["<h2>Changes over history</h2>", "<ul>",
                 *(f'<li class="reason">{html.escape(line)}</li>' for line in drift), "</ul>"]
    body += ["<h2>Every scenario</h2>", summary_table(results), "<h2>Scenarios</h2>"]
    figures = plots.scenario_figures(results) if figures is None else figures
    drawn = dict(zip(map(id, results), figures, strict=True))
    body += [scenario_section(r, trends.get(r["id"]), drawn[id(r)]) for r in ordered(results)
             if r["verdict"] != "SKIP"]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def write(out_dir: Path, page: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT
    path.write_text(page, encoding="utf-8")
    return path
