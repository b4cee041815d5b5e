"""Root cause first: which rank of a failed run is named, from its markers and the launcher's view of each exit."""

from __future__ import annotations

import signal

import pytest

from parity.harness.run.deaths import Death, Ending, describe, done_marker, failure_marker, rank_deaths

pytestmark = pytest.mark.torch_free

T = 1_000_000.0


def _raised(record_dir, rank: int, at: float, message: str) -> None:
    failure_marker(record_dir, rank).write_text(f"{at!r}\n{message}")


def test_a_silent_death_seen_just_after_a_peers_exception_is_the_cause(tmp_path):
    """The launcher sees rank 1's SIGSEGV milliseconds after rank 0 recorded 'Connection reset by peer' (its view
    lags)."""
    _raised(tmp_path, 0, T, "RuntimeError: Connection reset by peer")
    deaths = rank_deaths(tmp_path, 2, {0: Ending(T + 0.004, 1), 1: Ending(T + 0.003, -signal.SIGSEGV)})
    assert [(d.rank, d.kind) for d in deaths] == [(1, "signal"), (0, "exception")]
    assert describe(deaths).startswith("rank 1 died first: killed by SIGSEGV (signal 11); then rank 0: lost its "
                                       "connection to it (the collective library's message is in its log)")


def test_an_exception_well_before_a_silent_death_stays_first(tmp_path):
    """A rank aborted by a watchdog minutes after its peer raised is the consequence, not the cause."""
    _raised(tmp_path, 0, T, "ValueError: bad shape")
    deaths = rank_deaths(tmp_path, 2, {0: Ending(T + 0.01, 1), 1: Ending(T + 600, -signal.SIGABRT)})
    assert [d.rank for d in deaths] == [0, 1]


def test_between_exceptions_the_earlier_one_is_the_cause(tmp_path):
    _raised(tmp_path, 1, T + 0.002, "RuntimeError: Connection closed by peer")
    _raised(tmp_path, 0, T, "InjectedCrash: rank 0")
    assert [d.rank for d in rank_deaths(tmp_path, 2, {})] == [0, 1]


def test_an_exit_0_without_the_done_marker_is_a_death_and_one_with_it_is_not(tmp_path):
    _raised(tmp_path, 0, T, "RuntimeError: Connection reset by peer")
    deaths = rank_deaths(tmp_path, 2, {1: Ending(T + 0.001, 0)})
    assert deaths[0] == Death(1, T + 0.001, "exit", "exited with code 0 before finishing its run")
    done_marker(tmp_path, 1).touch()
    assert [d.rank for d in rank_deaths(tmp_path, 2, {1: Ending(T + 0.001, 0)})] == [0]


def test_ranks_the_launcher_killed_itself_are_not_deaths(tmp_path):
    _raised(tmp_path, 0, T, "ValueError: x")
    deaths = rank_deaths(tmp_path, 3, {0: Ending(T, 1), 1: Ending(T + 0.5, -9), 2: Ending(T + 0.5, -9)},
                         spared=frozenset({1, 2}))
    assert [d.rank for d in deaths] == [0]


def test_torchrun_s_own_failure_report_names_the_signal_and_the_workers_it_closed(tmp_path):
    """A torchrun worker is not the harness's child: its exit code comes from torchrun's report (rendered here by
    torch's own ChildFailedError), and the workers torchrun closes after the failure are not blamed."""
    pytest.importorskip("torch", reason="renders torch's own error (the Python 3.10 lane has no torch)")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from parity.harness.run.launch import _RankWatch

    report = ChildFailedError("parity.harness.run.worker", {
        1: ProcessFailure(local_rank=1, pid=4321, exitcode=-signal.SIGSEGV, error_file="")}).format_msg()
    log = tmp_path / "node0.log"
    log.write_text(f"W1203 Sending process 1234 closing signal SIGTERM\n{report}\n")
    watch = _RankWatch(tmp_path)
    watch.pids, watch.gone = {0: 1234, 1: 4321}, {1: T + 0.003, 0: T + 0.2}
    _raised(tmp_path, 0, T, "RuntimeError: Connection closed by peer")
    endings, spared = watch.torchrun_view([log])
    assert endings[1] == Ending(T + 0.003, -signal.SIGSEGV) and spared == frozenset({0})
    deaths = rank_deaths(tmp_path, 2, endings, spared)
    assert describe(deaths).startswith("rank 1 died first: killed by SIGSEGV (signal 11); then rank 0: lost its "
                                       "connection to it (the collective library's message is in its log)")


def test_a_peers_own_error_is_kept_and_only_the_collective_noise_is_shortened(tmp_path):
    """The clean twin: a peer that died of its own exception (not of the lost connection) keeps its message."""
    _raised(tmp_path, 0, T, "ValueError: bad shard")
    deaths = rank_deaths(tmp_path, 2, {0: Ending(T + 0.004, 1), 1: Ending(T + 0.003, -signal.SIGSEGV)})
    assert describe(deaths).endswith("; then rank 0: ValueError: bad shard")
    assert "GLHF" not in describe([*deaths[:1], Death(0, T + 0.004, "exception",
                                                      "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection "
                                                      "closed by peer [127.0.0.1]:17107. GLHF!")])
