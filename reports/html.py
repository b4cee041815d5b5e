"""report.html: one page (inline CSS, script and base64 PNG, nothing fetched from the network) that a reviewer opens
from the CI artifact, built for triage. It opens on a summary: verdict counts, what ran (commit, engine versions,
device, image) and what changed since the previous night, what did not pass with its reasons in causal order and
an ERROR's first-dying rank's log (each a link to its section), a heat map of headroom (worst check ÷ its limit)
per model and engine layout, and the SKIPs grouped by reason; then every row (sortable, the verdict second, under
a header that stays in view), the non-PASS scenarios expanded with their figures, and the PASS ones folded, their
figures drawn into files beside the page (`figures/`) and loaded when a row is opened, so an all-PASS night's page
stays small."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.harness.config.paths import REPORT
from parity.reports import heatmap, plots
from parity.reports.provenance import PACKAGES as PROVENANCE_PACKAGES
from parity.reports.table import (
    COLUMNS,
    FULL,
    SEVERITY,
    counts,
    no_golden,
    no_golden_line,
    reasons_block,
    skip_groups,
    summary_line,
)
from parity.reports.triage import first_rank_log, where_line

if TYPE_CHECKING:
    from parity.reports.provenance import Provenance

FIGURES = "figures"
"""Beside report.html: PASS rows' figures, fetched by the page when a reader opens the row."""
FIGURE_CSS_WIDTH_PX = round(plots.FIGURE_WIDTH_IN * 96)

STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #eee; }
table.sortable th { cursor: pointer; position: sticky; top: 0; z-index: 1; }
td.text, th.text { text-align: left; }
td.id { max-width: 28em; overflow: hidden; text-overflow: ellipsis; text-align: left; }
tr.PASS td.verdict { background: #c8efc8; } tr.FAIL td.verdict { background: #f5b7b1; }
tr.ERROR td.verdict { background: #f8c471; } tr.SKIP td.verdict { background: #e5e7e9; }
tr.WARN td.verdict { background: #f9e79f; }
section { margin: 1.5em 0; border-top: 1px solid #ddd; }
div.wide { overflow: auto; max-height: 85vh; }
img.figure { width: 100%; max-width: {FIGPX}px; height: auto; display: block; }
img { max-width: 100%; }
#provenance { grid-column: 1; font-family: monospace; font-size: 12px; background: #f4f6f7;
  padding: 0.3em 0.6em; border-radius: 4px; }
#provenance ul { margin: 0.2em 0; padding-left: 1.2em; }
#provenance .changed { color: #7d3c98; font-weight: 600; }
pre.log { background: #fdf2e9; border-left: 3px solid #e67e22; padding: 0.3em 0.6em; margin: 0.2em 0;
  white-space: pre-wrap; font-size: 11px; }
.where { color: #1a5276; font-weight: 600; }
.logpath { font-family: monospace; font-size: 11px; }
section.PASS details summary { font-weight: normal; }
.reason { color: #a93226; font-family: monospace; }
#overview { display: grid; grid-template-columns: minmax(24em, 1fr) auto; gap: 0 2em; align-items: start; }
#counts { grid-column: 1 / -1; display: flex; gap: 0.6em; align-items: center; flex-wrap: wrap; }
#heatmap { grid-column: 2; grid-row: 2 / span 20; }
#heatmaps { display: flex; flex-direction: column; gap: 0.5em; }
.count { font-size: 20px; font-weight: 600; padding: 0.2em 0.7em; border-radius: 4px; }
.count.PASS { background: #c8efc8; } .count.FAIL { background: #f5b7b1; } .count.ERROR { background: #f8c471; }
.count.SKIP { background: #e5e7e9; } .count.WARN { background: #f9e79f; }
#no-golden { flex-basis: 100%; }
#failures ul, #changes ul { margin: 0.3em 0; padding-left: 1.2em; }
#failures li { margin: 0.2em 0; }
table.heatmap { margin: 0.4em 0 0.8em; }
table.heatmap caption { text-align: left; font-weight: 600; }
table.heatmap td.cell a { text-decoration: none; font-weight: 600; }
table.heatmap td.cell small { margin-left: 0.3em; }
.band { padding: 0 0.4em; border-radius: 3px; }
details summary { cursor: pointer; font-weight: 600; }
"""

STYLE = STYLE.replace("{FIGPX}", str(FIGURE_CSS_WIDTH_PX))

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


def provenance_block(provenance: Provenance | None) -> str:
    """What ran and, with a history, what changed since the previous night (versions first, then verdicts)."""
    if provenance is None:
        return ""
    night = provenance.tonight
    versions = ", ".join(f"{name} <b>{html.escape(value)}</b>" for name, value in
                         ((n, night.packages.get(n, "-")) for n in PROVENANCE_PACKAGES))
    parts = [f"<div>commit <b>{html.escape(night.commit)}</b> · device {html.escape(night.devices)} · image "
             f"{html.escape(night.images)}</div>", f"<div>{versions}</div>"]
    if (heading := provenance.heading()) is not None:
        changed = [f'<li class="changed">changed: {html.escape(line)}</li>' for line in provenance.versions_changed]
        changed = changed or ["<li>versions: none changed</li>"]
        verdicts = [f"<li>{html.escape(line)}</li>" for line in provenance.verdicts_changed]
        verdicts = verdicts or ["<li>verdicts: none changed</li>"]
        parts.append(f'<div id="changes"><b>{html.escape(heading)}</b><ul>{"".join(changed + verdicts)}</ul></div>')
    return '<div id="provenance">' + "".join(parts) + "</div>"


def log_block(result: dict[str, Any], lines: int | None = None) -> str:
    """An ERROR's first-dying rank's log: its path, then its tail (the last `lines`), noise trimmed."""
    log = first_rank_log(result)
    if log is None:
        return ""
    shown = log.lines if lines is None else log.lines[-lines:]
    noise = f" ({log.trimmed} collective-library line(s) left out)" if log.trimmed else ""
    empty = "" if shown else " (nothing in it: the rank died without a word)"
    text = f'<pre class="log">{html.escape(chr(10).join(shown))}</pre>' if shown else ""
    return f'<div class="logpath">log: {html.escape(log.path)}{html.escape(noise + empty)}</div>{text}'



def overview(results: list[dict[str, Any]], wall_s: float | None, provenance: Provenance | None = None,
             lane: str | None = None) -> str:
    """The top of the page: the rows not run for want of a golden (naming `lane`), verdict counts, what ran and
    what changed since the previous night, what did not pass (each a link to its section) with its first reasons
    and an ERROR's rank log, the heat map of headroom, and the SKIPs grouped by reason."""
    tally = counts(results)
    warned = sum(1 for r in results if r["verdict"] == "PASS" and r.get("warnings"))
    badges = "".join(f'<span class="count {v}" data-verdict="{v}">{tally.get(v, 0)} {v}</span>'
                     for v in ("FAIL", "ERROR", "PASS", "SKIP"))
    if warned:
        badges += f'<span class="count WARN" data-verdict="WARN">{warned} WARN</span>'
    if missing := no_golden(results):  # first: such a night ran less than it shows, and is not green
        badges = (f'<div id="no-golden" class="count ERROR">{html.escape(no_golden_line(len(missing), lane))}</div>'
                  + badges)
    parts = [f'<div id="counts">{badges}<span>{html.escape(summary_line(results, wall_s))}</span></div>']
    if block := provenance_block(provenance):
        parts.append(block)
    by_id = {r["id"]: r for r in results}
    items = []
    for run_id, verdict, reasons in reasons_block(results):
        first = "".join(f'<div class="reason">{html.escape(reason)}</div>' for reason in reasons[:2])
        more = f"<div>… {len(reasons) - 2} more</div>" if len(reasons) > 2 else ""
        log = log_block(by_id[run_id], 4) if verdict == "ERROR" else ""
        where = where_line(by_id.get(run_id, {}))
        where = f'<div class="where">{html.escape(where)}</div>' if where else ""
        items.append(f'<li data-verdict="{verdict}"><a href="#{anchor(run_id)}"><b>{verdict}</b> '
                     f'{html.escape(run_id)}</a>{where}{first}{more}{log}</li>')
    parts.append('<div id="failures"><h2>Not passing</h2>'
                 + (f"<ul>{''.join(items)}</ul>" if items else "<p>nothing: every scenario that ran passed</p>")
                 + "</div>")
    if skipped := skip_groups(results):
        groups = "".join(f"<li><b>{len(ids)}</b> {html.escape(reason)}<br><small>{html.escape(', '.join(ids))}"
                         "</small></li>" for reason, ids in skipped)
        total = sum(len(ids) for _, ids in skipped)
        parts.append(f'<div id="skipped"><details><summary>{total} skipped, {len(skipped)} reason(s)</summary>'
                     f"<ul>{groups}</ul></details></div>")
    parts.append(heatmap.render([r for r in results if r["verdict"] != "SKIP"], anchor))
    return '<div id="overview">' + "\n".join(parts) + "</div>"


def _img(png: str, alt: str) -> str:
    return f'<img class="figure" alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'


def _figure_alt(result: dict[str, Any]) -> str:
    return (f"{result['id']}: loss, grad norm, their differences against the band, learning rate, "
            "|Δ log-prob|")


def scenario_section(result: dict[str, Any], trend: str | None = None, figure: str | None = None,
                     figure_file: str | None = None) -> str:
    """A non-PASS row open, with every reason, its rank log and its figures; a PASS row folded, its figure
    embedded or, with `figure_file` (a path beside the page), loaded only when opened."""
    reasons = {run_id: why for run_id, _, why in reasons_block([result])}.get(result["id"], [])
    verdict = html.escape(result["verdict"])
    head = f'{verdict} {html.escape(result["id"])}'
    body = [f'<div class="where">{html.escape(where)}</div>' for where in [where_line(result)] if where]
    body += [f'<div class="reason">{html.escape(reason)}</div>' for reason in reasons]
    if result["verdict"] == "ERROR":
        body.append(log_block(result))
    if figure_file is not None:
        body.append(f'<img class="figure" loading="lazy" alt="{html.escape(_figure_alt(result))}" '
                    f'src="{html.escape(figure_file)}">')
    elif figure is not None:
        body.append(_img(figure, _figure_alt(result)))
    if trend:
        body.append(_img(trend, f"{result['id']}: trend over earlier runs"))
    opening = f'<section id="{anchor(result["id"])}" data-id="{html.escape(result["id"])}" class="{verdict}">'
    if result["verdict"] == "PASS":
        return "\n".join([opening, f"<details><summary>{head}</summary>", *body, "</details></section>"])
    return "\n".join([opening, f"<h3>{head}</h3>", *body, "</section>"])


def render(results: list[dict[str, Any]], wall_s: float | None = None, title: str = "Parity results",
           trends: dict[str, str] | None = None, drift: list[str] | None = None,
           figures: list[str | None] | None = None, provenance: Provenance | None = None,
           side_files: dict[str, bytes] | None = None, lane: str | None = None) -> str:
    """The page. `trends`: run id -> trend PNG; `drift`: one line per flagged change (reports/history.py);
    `figures`: each result's scenario figure when drawn already (reports/early_figures.py), else drawn here;
    `provenance`: what ran and what changed since the previous night (reports/provenance.py); `side_files`: when
    given, PASS rows' figures go into it (relative path -> PNG bytes, for `write`) instead of into the page;
    `lane`: the nightly lane the results are of, named where rows await a golden."""
    trends = trends or {}
    body = [f"<h1>{html.escape(title)}</h1>", overview(results, wall_s, provenance, lane)]
    if drift:
        body += ["<h2>Changes over history</h2>", "<ul>",
                 *(f'<li class="reason">{html.escape(line)}</li>' for line in drift), "</ul>"]
    body += ["<h2>Every scenario</h2>", summary_table(results), "<h2>Scenarios</h2>"]
    figures = plots.scenario_figures(results) if figures is None else figures
    drawn = dict(zip(map(id, results), figures, strict=True))
    for r in ordered(results):
        if r["verdict"] == "SKIP":
            continue
        figure, figure_file = drawn[id(r)], None
        if side_files is not None and r["verdict"] == "PASS" and figure is not None:
            figure_file = f"{FIGURES}/{anchor(r['id'])}.png"
            side_files[figure_file] = base64.b64decode(figure)
        body.append(scenario_section(r, trends.get(r["id"]), figure, figure_file))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def write(out_dir: Path, page: str, side_files: dict[str, bytes] | None = None) -> Path:
    """OUT/report.html, and the files it links (`render`'s side_files) beside it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in (side_files or {}).items():
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_bytes(data)
    path = out_dir / REPORT
    path.write_text(page, encoding="utf-8")
    return path
