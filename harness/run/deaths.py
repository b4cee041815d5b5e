"""Which rank of a failed run died first, and how: the root cause named first, its consequences after it.

When one rank dies, its peers die of the broken connection ("Connection reset by peer") a moment later. Each
rank's end is known three ways: a rank that raises writes its failure time and exception to a marker
(`rank<N>.failed`) before it exits; a rank that finishes writes `rank<N>.done`; the launcher sees each rank
end (exit code, signal) as it happens. A rank killed by a signal, or exiting without either marker (an
`os._exit(0)` mid-step), leaves no marker: its time is when the launcher saw it end, a little after the fact.
So a silent death seen within SIMULTANEOUS_S of the first exception is taken as the cause: a peer's exception
about the lost connection cannot have killed it, while its death explains the peer's exception.
"""

from __future__ import annotations

import contextlib
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

COLLECTIVE_NOISE = re.compile(
    r"gloo[:/]|ProcessGroup(Gloo|NCCL|HCCL)|Connection (reset|closed) by peer|GLHF|\[c10d\]|c10d::|"
    r"socket\.cpp|TCPStore|NCCL (WARN|INFO)|HCCL_|watchdog|torch\.distributed\.elastic|"
    r"Broken pipe|Application timeout caused pair closure", re.IGNORECASE)
"""What a collective library prints when a peer goes away: the death's consequence, never its cause (gloo's
`Connection reset by peer ... GLHF`, NCCL / HCCL watchdogs, torch.distributed's store and elastic agent)."""

SIMULTANEOUS_S = 2.0
"""A silent death observed this soon after an exception (the launcher's view lags the death itself, and a peer
fails within milliseconds of losing its connection) ranks before it."""

DeathKind = Literal["exception", "signal", "exit"]


def failure_marker(record_dir: str | Path, rank: int) -> Path:
    """File a failing rank writes its failure time and exception to."""
    return Path(record_dir) / f"rank{rank}.failed"


def done_marker(record_dir: str | Path, rank: int) -> Path:
    """File a rank writes when its body returned: an exit without it is a death, whatever the exit code."""
    return Path(record_dir) / f"rank{rank}.done"


def failure_message(record_dir: str | Path, rank: int) -> str:
    """The exception a failed rank recorded in its marker ('' if none)."""
    try:
        return failure_marker(record_dir, rank).read_text().partition("\n")[2].strip()
    except OSError:
        return ""


def _failure_time(record_dir: Path, rank: int) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        return float(failure_marker(record_dir, rank).read_text().partition("\n")[0])
    return None


def finished(record_dir: str | Path, rank: int) -> bool:
    return done_marker(record_dir, rank).is_file()


def signal_name(code: int) -> str:
    """'SIGSEGV (signal 11)' for an exit code of -11."""
    try:
        return f"{signal.Signals(-code).name} (signal {-code})"
    except ValueError:
        return f"signal {-code}"


@dataclass(frozen=True, slots=True)
class Death:
    rank: int
    at: float
    """time.time() of the death: the rank's own for an exception, the launcher's observation otherwise."""
    kind: DeathKind
    detail: str


@dataclass(frozen=True, slots=True)
class Ending:
    """How the launcher saw one rank end."""

    at: float
    code: int | None
    """Exit code (negative: the signal), None when the launcher cannot read it (a torchrun worker)."""


def rank_deaths(record_dir: Path, world_size: int, endings: dict[int, Ending],
                spared: frozenset[int] = frozenset()) -> list[Death]:
    """Every rank that died rather than finished, root cause first. `spared`: ranks the launcher itself killed
    after the failure (they died of it, not of their own accord) unless they recorded an exception first."""
    deaths = []
    for rank in range(world_size):
        at = _failure_time(record_dir, rank)
        if at is not None:
            deaths.append(Death(rank, at, "exception", failure_message(record_dir, rank) or "raised"))
            continue
        ending = endings.get(rank)
        if ending is None or rank in spared:
            continue
        if ending.code is not None and ending.code < 0:
            deaths.append(Death(rank, ending.at, "signal", f"killed by {signal_name(ending.code)}"))
        elif ending.code not in (None, 0):
            deaths.append(Death(rank, ending.at, "exit", f"exited with code {ending.code} without raising"))
        elif not finished(record_dir, rank):
            code = "" if ending.code is None else f" with code {ending.code}"
            deaths.append(Death(rank, ending.at, "exit", f"exited{code} before finishing its run"))
    return root_cause_first(deaths)


def root_cause_first(deaths: list[Death]) -> list[Death]:
    """By time, except that a silent death (signal, exit without a marker) seen within SIMULTANEOUS_S of the first
    exception goes first."""
    if not deaths:
        return []
    ordered = sorted(deaths, key=lambda d: d.at)
    first = ordered[0]
    silent = [d for d in ordered if d.kind != "exception" and d.at - first.at <= SIMULTANEOUS_S]
    cause = silent[0] if silent else first
    return [cause, *(d for d in ordered if d is not cause)]


def describe(deaths: list[Death]) -> str:
    """'rank 1 died first: killed by SIGSEGV (signal 11); then rank 0: RuntimeError: ... (<delay> s later)'."""
    cause, *rest = deaths
    text = f"rank {cause.rank} died first: {cause.detail}"
    for death in rest:
        later = death.at - cause.at
        when = f" ({later:.2g} s later)" if later >= 0 else ""
        detail = ("lost its connection to it (the collective library's message is in its log)"
                  if COLLECTIVE_NOISE.search(death.detail) else death.detail)
        text += f"; then rank {death.rank}: {detail}{when}"
    return text
