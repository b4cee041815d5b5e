"""Launch the ranks of one run, bounded by a timeout, and report how it ended.

Two launchers, one rank body (`parity.harness.run.worker.run_rank`):
- `ForkedLauncher` (default on one node): ranks are forked from a forkserver that imported torch,
  transformers (and megatron.core) ONCE, so a scenario costs a fork, not a 5-10 s interpreter start. The
  rendezvous is a TCPStore the parent binds on port 0: no fixed port, no race.
- `TorchrunLauncher` (multi-node, or `--launcher torchrun`): one torchrun per node with c10d rendezvous.
A rank that fails ends the run at once (its peers are killed, not left in a collective); a run past its
timeout is killed with every process of its process groups.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from parity.harness.contract.schema import Layout
from parity.harness.run.worker import RunJob, exit_after, failure_marker, failure_message, run_rank

LaunchStatus = Literal["ok", "error", "timeout"]
POLL_S = 0.02


class Interrupted(BaseException):
    """SIGTERM / SIGINT reached the harness. A BaseException, so per-scenario isolation (`except Exception`) does
    not swallow it: the launchers' `finally` kill the ranks, the runner records the scenario and stops."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into `Interrupted` in the main thread for the duration (no-op elsewhere)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass(frozen=True, slots=True)
class LaunchResult:
    status: LaunchStatus
    wall_time_s: float
    error: str | None = None
    log_tail: str | None = None


def tail(path: Path, lines: int = 50) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_group(pid: int | None) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_ranks(record_dir: Path) -> None:
    """Kill the ranks that registered a pid file (torchrun starts its workers in sessions of their own, so
    killing torchrun's process group leaves them running), with their own process groups."""
    for pid_file in record_dir.glob("rank*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            _kill_group(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)


def _logs_tail(record_dir: Path, failed_rank: int | None) -> str:
    """The failing rank's log first (or every rank's, for a timeout), 30 lines each."""
    logs = sorted(record_dir.glob("rank*.log")) + sorted(record_dir.glob("node*.log"))
    if failed_rank is not None:
        logs = [record_dir / f"rank{failed_rank}.log"] + [p for p in logs if p.name != f"rank{failed_rank}.log"]
    return "\n".join(f"--- {p.name}\n{tail(p, 30)}" for p in logs[:2])


def wait_all(
    polls: list[Callable[[], int | None]], labels: list[str], deadline: float,
    log_tail: Callable[[int | None], str], deadline_s: float = 0.0,
) -> tuple[LaunchStatus, str | None, str | None]:
    """Wait until every process exits 0, one exits non-zero (error at once), or the deadline passes."""
    while True:
        codes = [poll() for poll in polls]
        failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None:
            return "error", f"{labels[failed]} exited with code {codes[failed]}", log_tail(failed)
        if all(c == 0 for c in codes):
            return "ok", None, None
        if time.perf_counter() > deadline:
            return "timeout", f"killed after its timeout ({deadline_s:g} s)", log_tail(None)
        time.sleep(POLL_S)


def _fresh_record_dir(job: RunJob) -> Path:
    """The run's directory, without failure markers left by an earlier run."""
    record_dir = Path(job.record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    for marker in [*record_dir.glob("rank*.failed"), *record_dir.glob("rank*.pid")]:
        marker.unlink(missing_ok=True)
    return record_dir


def first_failed_rank(record_dir: Path, world_size: int, grace_s: float = 1.0) -> int | None:
    """The rank whose failure marker is earliest (waiting briefly for markers of ranks still exiting)."""
    deadline = time.perf_counter() + grace_s
    while True:
        times = {}
        for rank in range(world_size):
            marker = failure_marker(record_dir, rank)
            with contextlib.suppress(OSError, ValueError):
                times[rank] = float(marker.read_text().partition("\n")[0])
        if times and (len(times) == world_size or time.perf_counter() > deadline):
            return min(times, key=times.__getitem__)
        if time.perf_counter() > deadline:
            return None
        time.sleep(POLL_S)


def _first_failure(record_dir: Path, rank: int, error: str | None) -> str:
    message = failure_message(record_dir, rank)
    return f"rank {rank} failed first" + (f": {message}" if message else "") + f" ({error})"


def _forked_rank(job: RunJob, rank: int, world_size: int, port: int, timeout_s: float) -> None:
    os.setpgrp()  # its own process group: the launcher kills the whole group
    log = os.open(Path(job.record_dir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(job.visible_devices or {})
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    exit_after(failure_marker(job.record_dir, rank), run_rank, job, rank, world_size, rank, store)


#: (pid, modules) of the forkserver this process started last. multiprocessing keeps ONE forkserver per process,
#: started with whatever preload was set last, so each launch checks that the running one suits it.
_server: tuple[int, tuple[str, ...]] | None = None
#: modules later launches of this process will ask for (expect_preload)
_expected: list[str] = []


def expect_preload(modules: Sequence[str]) -> None:
    """Modules later launches of this process will ask for. A forkserver this process starts imports them too, so
    the first one serves every later launch instead of being replaced by a bigger one (each start preloads for
    ~6 s). The pytest plugin says what the session's scenario items need before any test launches: a test that
    runs an hf row first would otherwise start a server the Megatron rows must replace."""
    _expected[:] = list(dict.fromkeys([*_expected, *modules]))


def _ensure_forkserver(preload: Sequence[str], exclude: Sequence[str] = ()) -> None:
    """A running forkserver that imported every module of `preload` and no module under a top-level name in
    `exclude`. One that does not (started by another launcher of this process, e.g. for hf rows only after an
    in-process `parity run` closed the first server, or one holding megatron when MindSpeed must patch it first)
    is restarted with `preload`: otherwise every Megatron rank imports megatron.core itself (~3 s a rank)."""
    global _server
    from multiprocessing import forkserver

    # ranks leave through os._exit, so the resource tracker (started with the server) would warn about
    # semaphores it still tracks
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
    server = forkserver._forkserver
    running = server._forkserver_pid
    if running is not None and _server is not None and _server[0] == running:
        held = _server[1]
        if set(preload) <= set(held) and not any(m.split(".")[0] in exclude for m in held):
            server.ensure_running()  # one that died meanwhile starts again with the same preload (set below)
            _server = (server._forkserver_pid, held)
            return
    if running is not None:
        with contextlib.suppress(OSError, ChildProcessError):
            server._stop()
        server._forkserver_pid = None
    modules = list(dict.fromkeys([*preload, *(m for m in _expected if m.split(".")[0] not in exclude)]))
    server.set_forkserver_preload(modules)
    server.ensure_running()
    _server = (server._forkserver_pid, tuple(modules))


def start_forkserver(preload: Sequence[str], exclude: Sequence[str] = ()) -> None:
    """Start the warm forkserver now rather than at the first launch, so that its imports (torch, transformers,
    megatron.core: ~5 s) run on another core while the caller imports the runner and the judge (torch, ~2.5 s).
    Returns at once; the first launch waits for the server if it is still importing."""
    _ensure_forkserver(preload, exclude)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While ranks start, the caller's __main__ has neither a file nor a module name, so multiprocessing does not
    make each rank import it again (as __mp_main__): a rank needs only parity's own importable modules, and under
    `parity run` that import (the CLI, the reports, matplotlib) cost every scenario ~1 s of its ~2. The
    forkserver's own '__main__' preload cannot help: CPython 3.11's forkserver looks for a 'main_path' key that
    spawn.get_preparation_data never writes."""
    main = sys.modules["__main__"]
    file, spec = main.__dict__.pop("__file__", None), getattr(main, "__spec__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__spec__ = spec
        if file is not None:
            main.__file__ = file


class ForkedLauncher:
    """Ranks forked from one warm forkserver per harness process."""

    def __init__(self, preload: Sequence[str] = ("torch", "parity.harness.run.worker"),
                 exclude: Sequence[str] = ()) -> None:
        self._mp = multiprocessing.get_context("forkserver")
        self.preload = tuple(preload)
        self.exclude = tuple(exclude)
        """Top-level modules the forkserver must not have imported (an engine patches them before import)."""

    def close(self) -> None:
        """Stop the forkserver and the resource tracker it started (both outlive the harness otherwise when it is
        signalled). Python keeps no public API for either; the private stops exist since 3.8."""
        from multiprocessing import forkserver, resource_tracker

        for server in (forkserver._forkserver, resource_tracker._resource_tracker):
            # TypeError: a tracker whose start failed half-way keeps its fd but no pid (waitpid(None))
            with contextlib.suppress(AttributeError, OSError, ChildProcessError, TypeError):
                server._stop()

    def launch(self, job: RunJob, world_size: int, timeout_s: float) -> LaunchResult:
        import torch.distributed as dist

        record_dir = _fresh_record_dir(job)
        _ensure_forkserver(self.preload, self.exclude)
        started = time.perf_counter()
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        procs = [self._mp.Process(target=_forked_rank, args=(job, r, world_size, store.port, timeout_s),
                                  daemon=False) for r in range(world_size)]
        with _main_module_hidden():
            for proc in procs:
                proc.start()
        try:
            status, error, log_tail = wait_all([lambda p=p: p.exitcode for p in procs],
                                               [f"rank {r}" for r in range(world_size)], started + timeout_s,
                                               lambda i: _logs_tail(record_dir, i), timeout_s)
            if status == "error":
                first = first_failed_rank(record_dir, world_size)
                if first is not None:
                    error = _first_failure(record_dir, first, error)
                    log_tail = _logs_tail(record_dir, first)
        finally:
            for proc in procs:
                _kill_group(proc.pid)
                proc.join(timeout=5)
            _kill_ranks(record_dir)
            del store
        return LaunchResult(status, time.perf_counter() - started, error, log_tail)


def torchrun_commands(layout: Layout, job_file: Path, master_addr: str, port: int, run_id: str,
                      python: str = sys.executable) -> list[list[str]]:
    """One torchrun command per node. Static rendezvous: global ranks follow --node-rank, so rank 0 (which
    writes the record) is always on node 0, the node that compares and reports."""
    commands = []
    for node in range(layout.nodes):
        commands.append([
            python, "-m", "torch.distributed.run", f"--nnodes={layout.nodes}", f"--node-rank={node}",
            f"--nproc-per-node={layout.ranks_per_node}", "--rdzv-backend=static",
            f"--rdzv-endpoint={master_addr}:{port}", f"--rdzv-id={run_id}", "--max-restarts=0",
            "-m", "parity.harness.run.worker", "--job", str(job_file)])
    return commands


class TorchrunLauncher:
    """One torchrun per node on this host (multi-node on loopback for CPU tests; node 0 on real clusters)."""

    def __init__(self, master_addr: str = "127.0.0.1", nodes_here: Sequence[int] | None = None,
                 master_port: int | None = None) -> None:
        self.master_addr = master_addr
        self.nodes_here = nodes_here
        self.master_port = master_port

    def launch(self, job: RunJob, layout: Layout, timeout_s: float) -> LaunchResult:
        record_dir = _fresh_record_dir(job)
        job_file = record_dir / "job.json"
        job.to_file(job_file)
        port = self.master_port or free_port()
        commands = torchrun_commands(layout, job_file, self.master_addr, port, job.run_id.replace("/", "_"))
        nodes = list(self.nodes_here) if self.nodes_here is not None else list(range(layout.nodes))
        started = time.perf_counter()
        procs = []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(job.visible_devices or {})}
        for node in nodes:
            log = open(record_dir / f"node{node}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen(commands[node], stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True), log))
        try:
            status, error, log_tail = wait_all(
                [p.poll for p, _ in procs], [f"torchrun on node {n}" for n in nodes], started + timeout_s,
                lambda i: tail(record_dir / f"node{nodes[i or 0]}.log"), timeout_s)
            if status == "error" and (first := first_failed_rank(record_dir, layout.world_size)) is not None:
                error = _first_failure(record_dir, first, error)
        finally:
            for proc, log in procs:
                _kill_group(proc.pid)
                proc.wait(timeout=10)
                log.close()
            _kill_ranks(record_dir)
        return LaunchResult(status, time.perf_counter() - started, error, log_tail)
