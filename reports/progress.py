"""Progress of a long run: one line per finished scenario, and on a terminal a rich progress bar with the elapsed
time and an ETA below them (CI logs, pipes and files get the lines only)."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from parity.reports.terminal import progress_line


class RunProgress:
    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stdout
        self._bar: Progress | None = None
        if self.stream.isatty():
            self._bar = Progress(TextColumn("scenarios"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("ETA"), TimeRemainingColumn(), console=Console(file=self.stream),
                                 transient=True)
            self._task = self._bar.add_task("run", total=total)

    def __enter__(self) -> RunProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()

    def finished(self, result: dict[str, Any]) -> None:
        self.done += 1
        line = progress_line(self.done, self.total, result)
        if self._bar is None:
            print(line, file=self.stream, flush=True)
            return
        self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self._bar.advance(self._task)
