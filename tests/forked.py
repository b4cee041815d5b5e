"""Run a function in a process forked from the session's warm forkserver (the one the harness forks its ranks
from, torch and transformers imported), not in a fresh interpreter that spends its time importing them: for tests
that need a process of their own (peak RSS, a patched torch). Without a running server, multiprocessing starts
one for the call. `target` must be importable by name (a module-level function) and its result picklable."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


def _call_and_send(conn: Connection, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    conn.send(target(*args))
    conn.close()


def run_forked(target: Callable[..., Any], *args: Any, timeout: float = 300) -> Any:
    """target(*args) in a forked child; its return value, or AssertionError if it sends nothing in time (it died:
    EOFError)."""
    context = multiprocessing.get_context("forkserver")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_call_and_send, args=(send, target, args))
    child.start()
    send.close()
    try:
        assert receive.poll(timeout), f"{target.__name__} sent nothing in {timeout} s"
        return receive.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
