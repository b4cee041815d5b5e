"""Imported first by the forkserver (runner.py's preload list): warnings raised while it preloads the engines
(Megatron / Transformer Engine / Apex fall-backs, ...) are kept instead of printed on the terminal, and each forked
rank writes them into its own log (worker.run_rank calls replay once its stderr is the log). Importing this module
is the switch, so nothing else imports it."""

from __future__ import annotations

import sys
import warnings
from typing import Any, TextIO

CAPTURED: list[str] = []
_show = warnings.showwarning


def _keep(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    CAPTURED.append(warnings.formatwarning(message, category, filename, lineno, line))


warnings.showwarning = _keep


def replay(stream: TextIO | None = None) -> None:
    """In a forked rank: write the preload's warnings to its log, and show later warnings as usual."""
    warnings.showwarning = _show
    stream = stream or sys.stderr
    for text in CAPTURED:
        stream.write(text)
    stream.flush()
