"""Progress of a run: plain lines in logs and pipes; on a terminal the same lines above a bar with an ETA."""

from __future__ import annotations

import io

import pytest

from parity.reports.progress import RunProgress

pytestmark = pytest.mark.torch_free

RESULTS = [{"id": f"tiny-qwen3/fsdp2/dp2/fp32/cpu+{i}", "verdict": "PASS", "reasons": [],
            "metrics": {"wall_time_s": 1.0}} for i in range(3)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_one_line_per_scenario_and_no_bar():
    stream = io.StringIO()
    with RunProgress(3, stream) as progress:
        for result in RESULTS:
            progress.finished(result)
    assert stream.getvalue().splitlines() == [f"[{i + 1}/3] PASS  {r['id']} 1.0s" for i, r in enumerate(RESULTS)]


def test_a_terminal_gets_the_lines_and_a_bar_with_eta():
    stream = Terminal()
    with RunProgress(3, stream) as progress:
        progress.finished(RESULTS[0])
        progress._bar.refresh()
        shown = stream.getvalue()
        for result in RESULTS[1:]:
            progress.finished(result)
    assert f"[1/3] PASS  {RESULTS[0]['id']} 1.0s" in shown and "1/3" in shown and "ETA" in shown
    assert f"[3/3] PASS  {RESULTS[2]['id']}" in stream.getvalue()
