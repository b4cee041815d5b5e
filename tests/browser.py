"""Headless Chromium (Debian's `chromium` package) for the report tests: load a page, read its DOM back, and list
what a reviewer sees on the first screen before scrolling. The tests that use it SKIP where chromium is absent."""

from __future__ import annotations

import html as markup
import json
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREEN = (1280, 800)
"""A laptop's first screen: what a reviewer sees before scrolling."""

FIRST_SCREEN = """<script>
var inView = function (el) { var r = el.getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight
  && r.width > 0; };
var seen = Array.from(document.querySelectorAll("#provenance div, #provenance li, #failures li, #failures li div"))
  .filter(inView).map(function (el) { return el.innerText; });
document.body.dataset.screen = JSON.stringify(seen);
</script></body>"""
"""Appended to a report page: the provenance and failure lines fully in view, into the body's data-screen."""


def browse(page: Path, tmp: Path, *mode: str, size: str = "1400,1400") -> str:
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--window-size={size}",
                           *mode, page.as_uri()], capture_output=True, text=True, timeout=120, cwd=tmp)
    return done.stdout


def body_tag(dom: str) -> str:
    return dom[dom.index("<body"):].split(">", 1)[0]


def first_screen(page_text: str, directory: Path) -> str:
    """The provenance and failure lines of a report page a SCREEN-sized window shows before any scrolling."""
    page = directory / "first-screen.html"
    page.write_text(page_text.replace("</body>", FIRST_SCREEN))
    tag = body_tag(browse(page, directory, "--dump-dom", size=f"{SCREEN[0]},{SCREEN[1]}"))
    return "\n".join(json.loads(markup.unescape(tag.split('data-screen="', 1)[1].split('"', 1)[0])))
