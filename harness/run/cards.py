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
from parity.harness.contract.schema import Layout

# `or`: an empty value (a workflow expression of an unset variable) would be Path(""), the working directory
DEFAULT_LOCK_DIR = Path(os.environ.get("PARITY_CARD_LOCK_DIR") or "/tmp/parity-cards")


class Oversubscribed(ValueError):
    """More ranks would start on this host than it has cards: two ranks would share a card (or HCCL would fail
    at the first collective). Never launched."""


def host_ranks(layout: Layout, node_rank: int | None, device: str) -> int:
    """Ranks one `parity run` starts on this host: one node's with --node-rank, every node's without. On an
    accelerator a multi-node layout without --node-rank is refused: each node's torchrun would number its ranks
    from local rank 0 on the same cards."""
    if node_rank is not None or layout.nodes == 1:
        return layout.ranks_per_node
    if device != "cpu":
        raise Oversubscribed(f"layout spans {layout.nodes} nodes x {layout.ranks_per_node} ranks but no --node-rank "
                             f"was given, so every node would start on this host on the same {device} cards; run "
                             "`parity run ... --node-rank N --master-addr HOST --master-port PORT` on each node "
                             "(`parity plan` prints the commands) or make it one node")
    return layout.world_size


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
            raise Oversubscribed(f"{count} {self.device} ranks would start on this host but it has "
                                 f"{len(self.physical)} {self.device} cards ({','.join(map(str, self.physical))}); "
                                 "one rank per card: use a runner with more cards or a smaller layout")
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
