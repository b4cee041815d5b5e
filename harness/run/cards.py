"""Accelerator cards handed to runs so that concurrent runs (pytest-xdist workers, parallel CI jobs on one
runner) never share a card. A lease is a set of flock()ed files: the kernel drops it if a process dies.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from parity.harness.config.devices import DEVICE_KINDS

DEFAULT_LOCK_DIR = Path(os.environ.get("PARITY_CARD_LOCK_DIR", "/tmp/parity-cards"))


@dataclass(slots=True)
class CardLease:
    """Physical card ids held until release()."""

    cards: tuple[int, ...]
    _handles: list[IO[str]] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for handle in self._handles:
            handle.close()  # closing drops the flock
        self._handles.clear()

    def visible_env(self, device: str) -> dict[str, str]:
        name = DEVICE_KINDS[device].visible_env
        return {name: ",".join(map(str, self.cards))} if name else {}


class CardPool:
    """The cards of one device kind on this host; `physical` defaults to what the visible-devices variable
    already allows (a runner may have been given a subset) or 0..total-1."""

    def __init__(self, device: str, total: int, lock_dir: Path = DEFAULT_LOCK_DIR,
                 physical: list[int] | None = None) -> None:
        self.device = device
        env = os.environ.get(DEVICE_KINDS[device].visible_env or "", "")
        self.physical = physical or ([int(c) for c in env.split(",") if c.strip()] if env else list(range(total)))
        self.lock_dir = lock_dir
        lock_dir.mkdir(parents=True, exist_ok=True)

    def try_lease(self, count: int) -> CardLease | None:
        if count > len(self.physical):
            raise ValueError(f"{count} {self.device} cards requested, the pool has {len(self.physical)}")
        lease = CardLease(())
        taken = []
        for card in self.physical:
            handle = open(self.lock_dir / f"{self.device}{card}.lock", "a")  # noqa: SIM115 - held by the lease
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            lease._handles.append(handle)
            taken.append(card)
            if len(taken) == count:
                lease.cards = tuple(taken)
                return lease
        lease.release()
        return None

    def lease(self, count: int, timeout_s: float = 3600.0, poll_s: float = 0.5) -> CardLease:
        """Block until `count` cards are free together (never a partial lease, so no deadlock)."""
        deadline = time.monotonic() + timeout_s
        while (lease := self.try_lease(count)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {count} free {self.device} cards within {timeout_s:g} s")
            time.sleep(poll_s)
        return lease
