"""report.html: every scenario has its row (coloured by verdict) and its plots; layouts side by side."""

from __future__ import annotations

import pytest

from parity.reports import html
from parity.reports.provenance import Night, Provenance
from tests.unit.report_pages import RESULTS, Page, missing

pytestmark = pytest.mark.torch_free


def test_every_scenario_has_its_row_and_images():
    page = Page(html.render(RESULTS, wall_s=3.0))
    assert missing(page, RESULTS) == []
    assert page.rows["tiny-qwen3/fsdp2/dp2/fp32/cpu+grad_scale"] == "FAIL"
    assert page.rows["tiny-llama/mindspeed_fsdp/dp2/bf16/cpu"] == "SKIP"
    assert page.images["tiny-qwen3/fsdp2/dp2/fp32/cpu"] == 1  # loss, grad norm and histogram in one figure
    assert page.layout_images == 0  # the log-scale bar charts gave way to the heat map


def test_the_page_opens_on_counts_failures_heat_map_and_grouped_skips():
    from tests.unit.report_pages import night

    rows = night()
    since = Provenance(Night("abc123"), Night("0ld", date="2026-12-02"), "night-12", ["torch 2.12.0 -> 2.13.0"],
                       ["PASS -> FAIL: x"])
    text = html.render(rows, wall_s=65.0, provenance=since, figures=[None] * len(rows))
    top = text[text.index('<div id="overview">'):text.index("<h2>Every scenario</h2>")]
    assert '<span class="count FAIL" data-verdict="FAIL">2 FAIL</span>' in top
    skips = sum(r["verdict"] == "SKIP" for r in rows)
    assert f'<span class="count SKIP" data-verdict="SKIP">{skips} SKIP</span>' in top
    for bad in (r for r in rows if r["verdict"] in ("FAIL", "ERROR")):  # each linked from the top, reason shown
        assert f'href="#{html.anchor(bad["id"])}"><b>{bad["verdict"]}</b> {bad["id"]}</a>' in top
        assert f'<section id="{html.anchor(bad["id"])}"' in text
        assert bad["reasons"][0].replace(">", "&gt;") in top
    assert top.count('<table class="heatmap"') == 2  # fp32 and bf16
    assert "since the previous night, 2026-12-02 at commit 0ld (night-12)" in top
    assert "changed: torch 2.12.0 -&gt; 2.13.0" in top and "PASS -&gt; FAIL: x" in top
    assert top.count("<details>") == 1 and f"<b>{skips}</b> device npu: torch_npu is not installed" in top
    assert not [r for r in rows if r["verdict"] == "SKIP" and f'<section id="{html.anchor(r["id"])}"' in text]


def test_the_check_notices_a_page_that_lost_a_scenario():
    page = Page(html.render(RESULTS[1:]))
    lost = RESULTS[0]["id"]
    assert missing(page, RESULTS) == [f"{lost}: no row", f"{lost}: no image"]


def test_text_is_escaped():
    evil = RESULTS[0] | {"id": "tiny-qwen3/fsdp2/dp2/fp32/cpu+<script>", "reasons": ["<b>x</b>"], "verdict": "FAIL"}
    text = html.render([evil])
    assert "<script>\n" not in text.split("<script>", 1)[0] and "&lt;script&gt;" in text and "&lt;b&gt;" in text


def test_trends_and_drift_lines_are_shown():
    text = html.render(RESULTS[:1], trends={RESULTS[0]["id"]: "AAAA"}, drift=["step time +15% at run-3"])
    assert Page(text).images[RESULTS[0]["id"]] == 2 and "step time +15% at run-3" in text


def test_many_figures_drawn_by_worker_processes_match_one_process_and_survive_a_dead_worker(monkeypatch):
    """Enough results for worker processes: the same figures in the same order as drawn here; a worker that
    cannot start or dies leaves its share to this process, never a missing image."""
    from parity.reports import plots

    monkeypatch.setattr(plots, "PARALLEL_MIN", 4)  # 4 figures are enough to go parallel (and quick to draw)
    many = [r | {"id": f"{r['id']}#{i}"} for i in range(2) for r in RESULTS[:2]]
    serial = [plots.scenario_figure(r) for r in many]
    started = []
    popen = plots.subprocess.Popen
    monkeypatch.setattr(plots.subprocess, "Popen", lambda *a, **k: started.append(a) or popen(*a, **k))
    assert plots.scenario_figures(many, workers=2) == serial
    assert len(started) == 2  # the figures above came from two workers
    monkeypatch.setattr(plots.sys, "executable", "/bin/false")  # each worker exits at once, reading nothing
    assert plots.scenario_figures(many, workers=2) == serial
    monkeypatch.setattr(plots.sys, "executable", "/nonexistent/python")
    assert plots.scenario_figures(many, workers=2) == serial


def test_a_figure_is_the_same_whatever_the_process_drew_before_it(monkeypatch):
    """One canvas per process is redrawn for every result: nothing of the previous result (curves, histogram,
    legends, axis limits) may show in the next one's figure."""
    from parity.reports import plots

    def without(result: dict, key: str) -> dict:
        return result | {"metrics": {k: v for k, v in result["metrics"].items() if k != key}}

    drawn = [r for r in RESULTS if (r.get("metrics") or {}).get("series")]
    variants = [*drawn, without(drawn[0], "series"), without(drawn[0], "logprob_abs_hist")]
    monkeypatch.setattr(plots, "_canvas", None)
    forward = [plots.scenario_figure(r) for r in variants]
    monkeypatch.setattr(plots, "_canvas", None)
    backward = [plots.scenario_figure(r) for r in reversed(variants)][::-1]
    assert forward == backward and None not in forward
    assert len({forward[0], forward[-2], forward[-1]}) == 3  # the panels left empty do show empty


def _drawn_lines(early) -> int:
    return len(early._out.read_text().splitlines()) if early._out and early._out.is_file() else 0


def test_figures_drawn_during_the_run_are_the_figures_and_only_the_rest_is_drawn_at_the_end(monkeypatch):
    """EarlyFigures: the background worker's figures are taken (not drawn again), a result it never got is drawn
    at the end, and the page's figures are the bytes drawn in one process."""
    import time

    from parity.reports import early_figures, plots

    results = [r | {"id": f"{r['id']}#{i}"} for i in range(2) for r in RESULTS[:2]]
    serial = [plots.scenario_figure(r) for r in results]
    asked = []
    scenario_figures = plots.scenario_figures
    monkeypatch.setattr(early_figures.plots, "scenario_figures",
                        lambda missing: asked.append(missing) or scenario_figures(missing))
    early = early_figures.EarlyFigures()
    for result in results[:3]:
        early.submit(result)
    deadline = time.monotonic() + 60
    while _drawn_lines(early) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert early.figures(results) == serial
    assert asked == [[results[3]]]  # the worker's three were taken; only the unsubmitted one was drawn here


def test_a_dead_figure_worker_loses_no_figure():
    from parity.reports import early_figures, plots

    results = [r | {"id": f"{r['id']}#{i}"} for i in range(2) for r in RESULTS[:2]]
    serial = [plots.scenario_figure(r) for r in results]
    early = early_figures.EarlyFigures()
    early.submit(results[0])
    early._proc.kill()  # dies before it drew; a later submit finds the pipe broken
    early._proc.wait()
    for result in results[1:]:
        early.submit(result)
    assert early.figures(results) == serial
