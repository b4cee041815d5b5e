"""Concurrent runs never share a card: leases from separate processes are disjoint (fake card counts)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from parity.harness.run.cards import CardPool


def _hold(lock_dir, count, hold_s, queue):
    pool = CardPool("npu", 8, lock_dir)
    lease = pool.lease(count, timeout_s=30, poll_s=0.05)
    queue.put((time.monotonic(), "grant", lease.cards))
    time.sleep(hold_s)
    queue.put((time.monotonic(), "release", lease.cards))  # before the release: replay stays conservative
    lease.release()


def test_processes_get_disjoint_cards_and_wait_for_release(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_hold, args=(tmp_path, 4, 1.5, queue)) for _ in range(3)]
    for worker in workers:
        worker.start()
    events = [queue.get(timeout=60) for _ in range(6)]
    for worker in workers:
        worker.join(timeout=30)
    grants = [cards for _, kind, cards in events if kind == "grant"]
    assert len(grants) == 3 and all(len(cards) == 4 for cards in grants)
    # at any moment, the cards held are disjoint: replay grants/releases in time order
    held: list[tuple[int, ...]] = []
    for _, kind, cards in sorted(events):
        if kind == "release":
            held.remove(cards)
        else:
            assert not set(cards) & {c for h in held for c in h}
            held.append(cards)
            assert len(held) <= 2  # 8 cards, 4 each: the third waits


def test_lease_is_all_or_nothing_and_respects_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6")
    pool = CardPool("npu", 8, tmp_path)
    assert pool.physical == [4, 5, 6]
    first = pool.try_lease(2)
    assert first.cards == (4, 5)
    assert first.visible_env("npu") == {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    assert pool.try_lease(2) is None  # only card 6 is free: no partial lease
    first.release()
    assert pool.try_lease(3).cards == (4, 5, 6)
    with pytest.raises(ValueError, match="4 npu cards requested, the pool has 3"):
        pool.try_lease(4)
