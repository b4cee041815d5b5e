"""report.html in a real browser (headless Chromium from Debian's `chromium` package): its script runs to the end
without errors and the screenshot is not blank. SKIPs where chromium is absent."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from parity.reports import html
from tests.unit.report_pages import RESULTS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browse(page: Path, tmp: Path, *mode: str) -> str:
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--window-size=1400,1400",
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
