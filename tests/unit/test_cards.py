"""Concurrent runs never share a card: leases from separate processes are disjoint (fake card counts), and no
run starts more ranks on a host than it has cards."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from parity.harness.contract.schema import Layout
from parity.harness.run.cards import CardPool, Oversubscribed, host_ranks


def _hold(lock_dir, count, hold_s, queue, total=8):
    pool = CardPool("npu", total, lock_dir, physical=list(range(total)))
    lease = pool.lease(count, timeout_s=30, poll_s=0.05)
    queue.put((time.monotonic(), "grant", lease.cards))
    time.sleep(hold_s)
    queue.put((time.monotonic(), "release", lease.cards))  # before the release: replay stays conservative
    lease.release()


#: forked holders start within milliseconds of each other (spawned ones far apart, importing), so a hold of
#: under a second still makes the third wait
CONTEXT = multiprocessing.get_context("fork")


def test_processes_get_disjoint_cards_and_wait_for_release(tmp_path):
    ctx = CONTEXT
    queue = ctx.Queue()
    workers = [ctx.Process(target=_hold, args=(tmp_path, 4, 0.75, queue)) for _ in range(3)]
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
    with pytest.raises(Oversubscribed, match=r"4 npu ranks would start on this host but it has 3 npu cards \(4,5,6\)"):
        pool.try_lease(4)


def test_two_workers_run_8_card_scenarios_side_by_side_on_16_cards(tmp_path):
    """`pytest -n 2` on a 16-card runner: both 8-card leases are held AT ONCE (parallel, disjoint), and a third
    8-card scenario waits for a release instead of oversubscribing."""
    ctx = CONTEXT
    queue = ctx.Queue()
    workers = [ctx.Process(target=_hold, args=(tmp_path, 8, 1.0, queue, 16)) for _ in range(3)]
    for worker in workers:
        worker.start()
    events = sorted(queue.get(timeout=60) for _ in range(6))
    for worker in workers:
        worker.join(timeout=30)
    held: list[tuple[int, ...]] = []
    most = 0
    for _, kind, cards in events:
        if kind == "release":
            held.remove(cards)
            continue
        assert len(cards) == 8 and not set(cards) & {c for h in held for c in h}
        held.append(cards)
        most = max(most, len(held))
    assert most == 2  # two ran side by side; the third never joined them (it waited)
    first_release = next(t for t, kind, _ in events if kind == "release")
    grants = [t for t, kind, _ in events if kind == "grant"]
    assert sum(t < first_release for t in grants) == 2


@pytest.mark.parametrize(("layout", "node_rank", "device", "ranks"), [
    (Layout(dp=8), None, "npu", 8),
    (Layout(dp=16, nodes=2), 1, "npu", 8),  # one node of a two-node job
    (Layout(dp=16, nodes=2), None, "cpu", 16),  # CPU: both nodes on loopback is the tested path
])
def test_host_ranks(layout, node_rank, device, ranks):
    assert host_ranks(layout, node_rank, device) == ranks


def test_multi_node_on_one_accelerator_host_is_refused():
    """The old a3-16 lane: a 2 x 8 layout with no --node-rank started 16 ranks on the same 8 cards."""
    with pytest.raises(Oversubscribed, match=r"2 nodes x 8 ranks but no --node-rank was given"):
        host_ranks(Layout(dp=16, nodes=2), None, "npu")


def test_sixteen_ranks_on_an_eight_card_host_are_refused(tmp_path):
    pool = CardPool("npu", 8, tmp_path, physical=list(range(8)))
    with pytest.raises(Oversubscribed, match="16 npu ranks would start on this host but it has 8 npu cards"):
        pool.lease(host_ranks(Layout(dp=16), None, "npu"), timeout_s=1)


def test_runner_refuses_instead_of_launching(tmp_path, monkeypatch):
    """The runner's launch path: an 8-card host and a 16-rank scenario end as an error naming the cause, before
    any process starts (the cards are simulated: availability says 8)."""
    from parity.harness.config import devices
    from parity.harness.contract.schema import Scenario
    from parity.harness.run.worker import RunJob
    from parity.harness.runner import Runner, RunOptions

    monkeypatch.setattr(devices, "availability", lambda device: (8, None))
    monkeypatch.setattr("parity.harness.run.cards.DEFAULT_LOCK_DIR", tmp_path)
    scenario = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 16}, device="npu")
    job = RunJob(run_id=scenario.id, scenario={}, record_dir=str(tmp_path / "r"), cache_dir=str(tmp_path),
                 provenance={})
    result = Runner(RunOptions(out_dir=tmp_path))._launch(job, scenario)
    assert result.status == "error"
    assert "refused to launch: 16 npu ranks would start on this host but it has 8 npu cards" in result.error
    assert not (tmp_path / "r").exists()  # nothing was launched
