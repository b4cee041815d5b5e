"""report.html in a real browser (headless Chromium from Debian's `chromium` package): its script runs to the end
without errors and the screenshot is not blank; on a night of the default matrix the first screen shows the verdict
counts, the failures and the heat map, every row's verdict is on screen, and each FAIL / ERROR is linked from the
top. SKIPs where chromium is absent."""

from __future__ import annotations

import html as markup
import json
from pathlib import Path

from PIL import Image

from parity.reports import html
from tests.browser import SCREEN, body_tag, browse, first_screen, needs_chromium
from tests.unit.report_pages import RESULTS, night

pytestmark = needs_chromium


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


STICKY = """<script>
var box = document.querySelector("#summary").parentElement, th = document.querySelector("#summary th");
box.scrollIntoView(); box.scrollTop = 600;
if (box.scrollTop === 0) { window.scrollBy(0, 600); }  // a box that does not scroll: the reader scrolls the page
var b = box.getBoundingClientRect(), h = th.getBoundingClientRect();
document.body.dataset.sticky = JSON.stringify({box: b.top, th: h.top, scrolled: box.scrollTop,
                                               boxBottom: b.bottom, height: window.innerHeight});
</script></body>"""


def _sticky(text: str, tmp: Path) -> dict:
    page = html.write(tmp, text.replace("</body>", STICKY))
    tag = body_tag(browse(page, tmp, "--dump-dom", size=f"{SCREEN[0]},{SCREEN[1]}"))
    return json.loads(markup.unescape(tag.split('data-sticky="', 1)[1].split('"', 1)[0]))


def test_the_table_header_stays_in_view_while_its_rows_scroll(tmp_path):
    """The table scrolls in a box of its own, at most 85 % of the screen: 600 px down its rows, its header is still
    at the top of the box, on screen. The injected defect: the box as it was (sideways scrolling only): the reader
    scrolls the page and the header goes off the top with it."""
    rows = night()
    text = html.render(rows, figures=[None] * len(rows))
    seen = _sticky(text, tmp_path)
    assert seen["scrolled"] == 600 and abs(seen["th"] - seen["box"]) <= 1 and -1 <= seen["th"] < SCREEN[1], seen
    assert seen["boxBottom"] - seen["box"] <= seen["height"], seen
    old = text.replace("div.wide { overflow: auto; max-height: 85vh; }", "div.wide { overflow-x: auto; }")
    assert old != text
    seen = _sticky(old, tmp_path / "old")
    assert seen["th"] < 0, seen


def _planted_night() -> tuple[list[dict], object]:
    """A night of the default matrix in which a verl row against verl's main branch flipped PASS -> FAIL: its
    reasons in causal order, its first divergent module, and the first bad verl commit `parity bisect` found; the
    versions that changed since the previous night."""
    from parity.harness.judge.fingerprint import Divergence
    from parity.reports.provenance import Night, Provenance

    rows = night()
    where = Divergence("layer1.attention", "layer0.output", 0.31, 1e-4, 6).to_json()
    flipped = {"id": "tiny-qwen3/verl_fsdp/dp2/fp32/cpu", "verdict": "FAIL", "strategy": "verl_fsdp",
               "layout": "dp2", "dtype": "fp32",
               "reasons": ["log-prob before training max |Δ| = 0.0373 > limit 5e-05 (abs)",
                           "pre-clip grad norm rel diff at step 1 = 0.00216 > limit 5.03e-05 (rel)"],
               "metrics": {"first_divergent": where},
               "bisect": "first bad verl commit for tiny-qwen3/verl_fsdp/dp2/fp32/cpu: 77e0f1d2aa attention: fuse "
                         "the softmax scale (between 1dda039b9c good and 9f1c0e7b55 bad; 3 run(s))"}
    rows.insert(0, flipped)
    block = Provenance(Night("bbb2222", {"torch": "2.13.0", "verl": "0.10.0.dev @ 9f1c0e7b55"}, "Ascend910B3",
                             "ascend/verl:8.1", "2026-12-03"),
                       Night("aaa1111", date="2026-12-02"), "nightly-2026-12-02",
                       ["torch 2.12.0 -> 2.13.0", "verl 0.10.0.dev @ 1dda039b9c -> 0.10.0.dev @ 9f1c0e7b55"],
                       ["PASS -> FAIL: tiny-qwen3/verl_fsdp/dp2/fp32/cpu"])
    return rows, block


def test_a_failing_night_names_its_cause_on_the_first_screen(tmp_path):
    """Done when (issue 35): the first screen of a planted failing night names the failing rows, their first
    divergent step and module, the versions that changed since the previous night and, for the row against an
    upstream branch, the first bad commit."""
    rows, block = _planted_night()
    screen = first_screen(html.render(rows, wall_s=65.0, figures=[None] * len(rows), provenance=block), tmp_path)
    for bad in (r for r in rows if r["verdict"] in ("FAIL", "ERROR")):
        assert bad["id"] in screen, bad["id"]
    assert "first divergent module: layer1.attention (forward, step 1" in screen
    assert "pre-clip grad norm rel diff at step 1" in screen
    assert "changed: torch 2.12.0 -> 2.13.0" in screen and "since the previous night, 2026-12-02" in screen
    assert "first bad verl commit for tiny-qwen3/verl_fsdp/dp2/fp32/cpu: 77e0f1d2aa" in screen
    # the defect: the same night with what the page held before (no provenance, no module, no commit)
    bare = [{k: v for k, v in r.items() if k not in ("bisect", "metrics")} for r in rows]
    screen = first_screen(html.render(bare, wall_s=65.0, figures=[None] * len(rows)), tmp_path)
    assert "first divergent module" not in screen and "first bad" not in screen and "changed:" not in screen
