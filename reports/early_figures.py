"""Scenario figures drawn while the run goes on, not all at its end.

A report page draws one figure per scenario, and text layout makes each slow enough that drawing them all after
the last scenario kept the end of a run busy. Each result is handed, as it is recorded, to one background worker
(`python -m parity.reports.plots --stream FILE`, at the lowest CPU priority, so it draws in the time ranks and
tests leave idle); at the end what it has drawn is taken and the rest is drawn then, in parallel
(plots.scenario_figures). The worker changes no figure: each is the same bytes whichever process draws it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from parity.reports import plots


class EarlyFigures:
    """One run's background figure worker. `submit` each result as it is recorded, `figures` once at the end."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Path | None = None
        self._submitted: list[dict[str, Any]] = []
        self._broken = False
        """The worker could not start or its pipe broke: later results are drawn at the end."""

    def submit(self, result: dict[str, Any]) -> None:
        if self._broken:
            return
        try:
            if self._proc is None:
                fd, name = tempfile.mkstemp(prefix="parity-figures-", suffix=".jsonl")
                os.close(fd)
                self._out = Path(name)
                self._proc = subprocess.Popen([sys.executable, "-m", "parity.reports.plots", "--stream", name],
                                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL)
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(result, default=str) + "\n").encode())
            self._proc.stdin.flush()
        except OSError:  # BrokenPipeError: the worker died; what it wrote is still taken at the end
            self._broken = True
            return
        self._submitted.append(result)

    def figures(self, results: list[dict[str, Any]]) -> list[str | None]:
        """plots.scenario_figure of every result, in order: the worker's where it drew one, the rest drawn now."""
        drawn = dict(zip(map(id, self._submitted), self._finish(), strict=False))
        missing = [result for result in results if id(result) not in drawn]
        rest = iter(plots.scenario_figures(missing))
        return [drawn[id(result)] if id(result) in drawn else next(rest) for result in results]

    def _finish(self) -> list[str | None]:
        """Stop the worker where it is (its backlog is drawn in parallel here) and read what it finished: one
        complete JSON line per result, in order; a line cut off by the stop ends the list."""
        if self._proc is None or self._out is None:
            return []
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        figures: list[str | None] = []
        with contextlib.suppress(OSError):
            for line in self._out.read_text().splitlines():
                try:
                    figure = json.loads(line)
                except ValueError:
                    break
                if not (figure is None or isinstance(figure, str)):
                    break
                figures.append(figure)
            self._out.unlink()
        self._proc = None
        return figures
