"""report.html in a real browser (headless Chromium from Debian's `chromium` package): its script runs to the end
without errors and the screenshot is not blank; on a night of the default matrix the first screen shows the verdict
counts, the failures and the heat map, every row's verdict is on screen, and each FAIL / ERROR is linked from the
top. SKIPs where chromium is absent."""

from __future__ import annotations

import html as markup
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from parity.reports import html
from tests.unit.report_pages import RESULTS, night

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browse(page: Path, tmp: Path, *mode: str, size: str = "1400,1400") -> str:
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--window-size={size}",
                           *mode, page.as_uri()], capture_output=True, text=True, timeout=120, cwd=tmp)
    return done.stdout


def body_tag(dom: str) -> str:
    return dom[dom.index("<body"):].split(">", 1)[0]


def test_page_renders_without_script_errors_and_is_not_blank(tmp_path):
    page = html.write(tmp_path, html.render(RESULTS, wall_s=3.0))
    tag = body_tag(browse(page, tmp_path, "--dump-dom"))
    assert 'data-ready="1"' in tag and "data-script-error" not in tag
    browse(page, tmp_path, f"--screenshot={tmp_path / 'shot.png'}")
    colors = {rgb for _, rgb in Image.open(tmp_path / "shot.png").convert("RGB").getcolors(maxcolors=1 << 24)}
    assert len(colors) > 50  # a blank page has one colour; text, plots and verdict cells give thousands
    assert (0xC8, 0xEF, 0xC8) in colors and (0xF5, 0xB7, 0xB1) in colors  # PASS and FAIL cells were styled


def test_a_blank_page_is_seen(tmp_path):
    page = html.write(tmp_path, "<!DOCTYPE html><html><body></body></html>")
    browse(page, tmp_path, f"--screenshot={tmp_path / 'shot.png'}")
    assert len(Image.open(tmp_path / "shot.png").convert("RGB").getcolors(maxcolors=1 << 24)) <= 50


def test_a_script_error_is_seen(tmp_path):
    broken = html.render(RESULTS[:1]).replace('document.body.dataset.ready = "1";', 'undefinedCall();\n'
                                              'document.body.dataset.ready = "1";')
    page = html.write(tmp_path, broken)
    tag = body_tag(browse(page, tmp_path, "--dump-dom"))
    assert 'data-ready="1"' not in tag and "undefinedCall" in tag


SCREEN = (1280, 800)
"""A laptop's first screen: what a reviewer sees before scrolling."""

#: appended to a copy of the page under test: where things are laid out, as JSON on the body
MEASURE = """<script>
var w = window.innerWidth, h = window.innerHeight, box = function (el) { return el.getBoundingClientRect(); };
var rows = Array.from(document.querySelectorAll("#summary tbody tr")).map(function (tr) {
  var cell = tr.querySelector("td.verdict"), r = box(cell);
  return {id: tr.dataset.id, verdict: cell.textContent, cls: tr.className, visible: r.left >= 0 && r.right <= w
          && r.width > 0 && getComputedStyle(cell).visibility === "visible"};
});
var links = Array.from(document.querySelectorAll("#failures li a")).map(function (a) {
  var target = document.getElementById(a.getAttribute("href").slice(1));
  return {text: a.textContent, target: target ? target.dataset.id : null, top: box(a).top};
});
var tops = {};
["counts", "failures", "heatmap"].forEach(function (id) { var r = box(document.getElementById(id));
  tops[id] = {top: r.top, left: r.left, right: r.right}; });
tops.heatmapFail = box(document.querySelector("#heatmap td.cell[data-verdict=FAIL]")).top;
document.body.dataset.layout = JSON.stringify({width: w, height: h, rows: rows, links: links, tops: tops});
</script></body>"""


def layout(text: str, tmp: Path) -> dict:
    page = html.write(tmp, text.replace("</body>", MEASURE))
    tag = body_tag(browse(page, tmp, "--dump-dom", size=f"{SCREEN[0]},{SCREEN[1]}"))
    return json.loads(markup.unescape(tag.split('data-layout="', 1)[1].split('"', 1)[0]))


def test_the_check_sees_a_verdict_off_screen(tmp_path, monkeypatch):
    """The injected defect: the verdict as the last of 21 columns, as before, is off a 1280 px screen."""
    rows = night()
    monkeypatch.setattr(html, "FULL", [h for h in html.FULL if h != "verdict"] + ["verdict"])
    seen = layout(html.render(rows, figures=[None] * len(rows)), tmp_path)
    assert not any(r["visible"] for r in seen["rows"])


def test_the_first_screen_shows_counts_failures_and_the_heat_map_and_every_verdict_is_visible(tmp_path):
    """On a night of the default matrix: every row's verdict is on screen (the verdict column second), each FAIL /
    ERROR is linked from the first screen to its section, and a screenshot of the first screen holds the FAIL /
    ERROR count badges, the failures with their reasons and the heat map with its failing cells."""
    rows = night()
    text = html.render(rows, wall_s=65.0, figures=[None] * len(rows))
    seen = layout(text, tmp_path)
    assert seen["width"] == SCREEN[0] and len(seen["rows"]) == len(rows)
    assert [r["id"] for r in seen["rows"] if not r["visible"]] == []
    assert all(r["verdict"] == r["cls"] for r in seen["rows"])
    bad = [r["id"] for r in rows if r["verdict"] in ("FAIL", "ERROR")]
    assert sorted(link["target"] for link in seen["links"]) == sorted(bad)  # each link lands on its section
    assert all(link["top"] < SCREEN[1] for link in seen["links"])  # in the first screen
    for part in ("counts", "failures", "heatmap"):
        assert 0 <= seen["tops"][part]["top"] < SCREEN[1] * 0.3, part
        assert seen["tops"][part]["right"] <= SCREEN[0], part
    assert seen["tops"]["heatmapFail"] < SCREEN[1]
    page = html.write(tmp_path / "shot", text)
    browse(page, tmp_path, f"--screenshot={tmp_path / 'top.png'}", size=f"{SCREEN[0]},{SCREEN[1]}")
    shot = Image.open(tmp_path / "top.png").convert("RGB")
    assert shot.size == SCREEN
    colours = {rgb for _, rgb in shot.getcolors(maxcolors=1 << 24)}
    for name, rgb in (("FAIL badge", (0xF5, 0xB7, 0xB1)), ("ERROR badge", (0xF8, 0xC4, 0x71)),
                      ("heat map: failing cell", (0xC0, 0x39, 0x2B)), ("heat map: far under", (0x1E, 0x84, 0x49)),
                      ("heat map: ERROR cell", (0x17, 0x20, 0x2A)), ("failure reason text", (0xA9, 0x32, 0x26))):
        assert rgb in colours, f"{name} is not on the first screen"
