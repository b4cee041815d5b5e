"""Launch the ranks of one run, bounded by a timeout, and report how it ended.

Two launchers, one rank body (`parity.harness.run.worker.run_rank`):
- `ForkedLauncher` (default on one node): ranks are forked from a forkserver that imported torch,
  transformers (and megatron.core) ONCE, so a scenario costs a fork, not an interpreter start
  (benchmarks/launch_overhead.py). The rendezvous is a TCPStore the parent binds on port 0: no fixed port, no race.
- `TorchrunLauncher` (multi-node, or `--launcher torchrun`): one torchrun per node, static or c10d rendezvous; a
  multi-node launch pins the ranks' sockets to this node's interface toward the master (`node_interface`).
A rank that fails ends the run at once (its peers are killed, not left in a collective), and the error names the
rank that died first (parity.harness.run.deaths); a run past its timeout is killed with every process of its
process groups. Ranks die with the harness even when it is killed with -9 (a parent-death signal).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from parity.harness.config.paths import JOB
from parity.harness.contract.schema import Layout
from parity.harness.run.deaths import Ending, describe, finished, rank_deaths
from parity.harness.run.worker import RunJob, die_with_parent, exit_after

LaunchStatus = Literal["ok", "error", "timeout"]
POLL_S = 0.02


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


#: The variables that pin a multi-node run's sockets to one interface of each node. HCCL's host socket (how a
#: communicator's ranks reach its root) takes HCCL_IF_IP over HCCL_SOCKET_IFNAME; with neither it takes the first
#: interface by name that is not docker or lo, and "if that does not reach the root's, building the links fails"
#: (CANN environment-variable reference, HCCL_IF_IP / HCCL_SOCKET_IFNAME). gloo, which verl's ranks initialise beside
#: hccl (verl/utils/distributed.py: "cpu:gloo,npu:hccl"), takes GLOO_SOCKET_IFNAME. verl's Ascend multi-node guide has
#: the user export the interface that reaches the master by hand on every node (verl: docs/ascend_tutorial/
#: model_support/examples/multi-machine_task_startup_practice.rst, `ip route get "$MASTER_ADDR"`); the launcher
#: derives it, and sets them on every device (inert off the NPU: the CPU rehearsal's agents carry what an NPU node's
#: do).
INTERFACE_VARS = ("HCCL_IF_IP", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
NODE_IFNAME = "PARITY_NODE_IFNAME"
"""The runner's choice of interface for this node; wins over the route to the master."""


class InterfaceError(ValueError):
    """This node's interface toward the master cannot be found: the run is refused, naming what to set."""


@dataclass(frozen=True, slots=True)
class NodeInterface:
    name: str
    address: str | None
    """Its address toward the master (None: it has none of the master's address family)."""
    how: str
    env: dict[str, str]
    """What the launcher adds for the ranks: only variables the runner left unset."""
    kept: dict[str, str]
    """The runner's own values of INTERFACE_VARS, passed on as they are."""

    def describe(self) -> str:
        added = " ".join(f"{k}={v}" for k, v in self.env.items()) or "nothing"
        kept = f"; kept from the runner: {' '.join(f'{k}={v}' for k, v in self.kept.items())}" if self.kept else ""
        return f"interface {self.name} ({self.how}): sets {added}{kept}"


def _addresses() -> dict[str, list[str]]:
    """Every interface's IPv4 and IPv6 addresses, scope suffixes dropped (psutil: a dependency already; the
    standard library has no portable listing, and SIOCGIFADDR gives one IPv4 address per interface)."""
    import psutil

    families = (socket.AF_INET, socket.AF_INET6)
    return {name: [a.address.split("%")[0] for a in addrs if a.family in families]
            for name, addrs in psutil.net_if_addrs().items()}


def route_source(master_addr: str, port: int) -> str:
    """This host's address on its route to the master. Connecting a UDP socket sends nothing; the kernel picks
    the source address its routing table would. Unlike `ip route get` (verl's guide), which answers `dev lo` on
    the master itself, this gives the master its own address on the interface the other nodes reach."""
    try:
        infos = socket.getaddrinfo(master_addr, port or 9, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InterfaceError(f"cannot resolve the master address {master_addr!r} ({exc})") from None
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(sockaddr)
            return sock.getsockname()[0].split("%")[0]
    except OSError as exc:
        raise InterfaceError(f"no route from this host to the master {master_addr} ({exc.strerror or exc})") from None


def _one_interface(value: str | None) -> str | None:
    """The one interface a runner's HCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names: `eth0`, or HCCL's exact `=eth0`.
    HCCL's lists, `^` exclusions and prefixes matching several interfaces name no one interface."""
    found = re.fullmatch(r"=?([\w.:@-]+)", value or "")
    return found.group(1) if found else None


def node_interface(master_addr: str, port: int, environ: Mapping[str, str] = os.environ) -> NodeInterface:
    """The interface this node's ranks use toward the master, and the INTERFACE_VARS the launcher adds for them.
    The interface is PARITY_NODE_IFNAME (one that is not here refuses the launch), else the one interface the
    runner named in HCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, else the one holding this host's source address toward
    the master. A variable the runner set is never replaced, and HCCL_IF_IP is not added beside a runner's
    HCCL_SOCKET_IFNAME pattern (it would override it)."""
    kept = {k: environ[k] for k in INTERFACE_VARS if environ.get(k)}
    addresses = _addresses()
    # the runner's own variables name this node's interface only where they name one that is here: anything else is
    # HCCL's or gloo's to read (a prefix list, an exclusion), kept and left to them
    named = [(NODE_IFNAME, environ.get(NODE_IFNAME))] + [
        (k, one) for k in INTERFACE_VARS[1:] if (one := _one_interface(kept.get(k))) in addresses]
    source = route_source(master_addr, port)
    how, name = next(((f"{var}={value}", value) for var, value in named if value), (None, None))
    if name is None:
        name = next((n for n, addrs in addresses.items() if source in addrs), None)
        if name is None:
            raise InterfaceError(f"this host's address toward the master {master_addr} ({source}) is on no "
                                 f"interface here ({', '.join(addresses)}): set {NODE_IFNAME}")
        how = f"the route to {master_addr}"
    elif name not in addresses:
        raise InterfaceError(f"{how}: no such interface here (there are {', '.join(addresses)})")
    family = socket.AF_INET6 if ":" in source else socket.AF_INET
    own = [a for a in addresses[name] if (":" in a) == (family == socket.AF_INET6)]
    address = source if source in addresses[name] else (own[0] if own else None)
    # HCCL reads a bare name as a prefix (`eth1` would match eth10 too); `=` names exactly one interface
    env = {var: form.format(name) for var, form in (("HCCL_SOCKET_IFNAME", "={}"), ("GLOO_SOCKET_IFNAME", "{}"))
           if var not in kept}
    hccl_named = kept.get("HCCL_SOCKET_IFNAME")
    if "HCCL_IF_IP" not in kept and (hccl_named is None or _one_interface(hccl_named) in addresses):
        if address is None:
            raise InterfaceError(f"interface {name} ({how}) has no address of the master's family "
                                 f"({master_addr}): set HCCL_IF_IP or {NODE_IFNAME}")
        env = {"HCCL_IF_IP": address, **env}
    return NodeInterface(name, address, how, env, kept)


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
    """The failing rank's log first (or every rank's, for a timeout), 30 lines each, each under a `--- <path>`
    header naming its file (the reports show the first-dying rank's path: parity.reports.triage)."""
    logs = sorted(record_dir.glob("rank*.log")) + sorted(record_dir.glob("node*.log"))
    if failed_rank is not None:
        logs = [record_dir / f"rank{failed_rank}.log"] + [p for p in logs if p.name != f"rank{failed_rank}.log"]
    return "\n".join(f"--- {p}\n{tail(p, 30)}" for p in logs[:2] if p.is_file())


def wait_all(
    polls: list[Callable[[], int | None]], labels: list[str], deadline: float,
    log_tail: Callable[[int | None], str], deadline_s: float = 0.0, watch: Callable[[], bool] | None = None,
) -> tuple[LaunchStatus, str | None, str | None]:
    """Wait until every process exits 0, one exits non-zero (error at once), `watch` says a rank died, or the
    deadline passes."""
    while True:
        codes = [poll() for poll in polls]
        failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None:
            return "error", f"{labels[failed]} exited with code {codes[failed]}", log_tail(failed)
        if watch is not None and watch():
            return "error", "a rank died", log_tail(None)
        if all(c == 0 for c in codes):
            return "ok", None, None
        if time.perf_counter() > deadline:
            return "timeout", f"killed after its timeout ({deadline_s:g} s)", log_tail(None)
        time.sleep(POLL_S)


def _fresh_record_dir(job: RunJob) -> Path:
    """The run's directory, without markers left by an earlier run."""
    record_dir = Path(job.record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    for marker in [*record_dir.glob("rank*.failed"), *record_dir.glob("rank*.done"), *record_dir.glob("rank*.pid")]:
        marker.unlink(missing_ok=True)
    return record_dir


GRACE_S = 1.0
"""After the first death, how long the other ranks get to end by themselves (their exceptions say what the death
did to them) before they are killed."""


def _failure(record_dir: Path, world_size: int, endings: dict[int, Ending], spared: frozenset[int],
             fallback: str | None) -> tuple[str | None, str | None]:
    """(error, log tail) of a failed run: the rank that died first, with its signal or exception and its log
    first, then what happened to the others."""
    deaths = rank_deaths(record_dir, world_size, endings, spared)
    if not deaths:
        return fallback, _logs_tail(record_dir, None)
    return describe(deaths), _logs_tail(record_dir, deaths[0].rank)


def _release_forkserver() -> None:
    """Close this process's copy of the forkserver's 'alive' pipe. multiprocessing hands it to every process the
    server forks, and the server exits only once every holder has closed it: a rank holding it keeps the server
    alive after the harness is killed, and so itself (its parent-death signal waits for the server)."""
    from multiprocessing import forkserver

    fd = forkserver._forkserver._forkserver_alive_fd
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        forkserver._forkserver._forkserver_alive_fd = None


def _forked_rank(job: RunJob, rank: int, world_size: int, port: int, timeout_s: float, parent: int) -> None:
    _release_forkserver()
    die_with_parent(parent)  # the forkserver, which exits when the harness does (however it dies)
    os.setpgrp()  # its own process group: the launcher kills the whole group
    log = os.open(Path(job.record_dir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(job.visible_devices or {})
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    exit_after(job.record_dir, rank, job.rank_body(), job, rank, world_size, rank, store)


#: (pid, modules) of the forkserver this process started last. multiprocessing keeps ONE forkserver per process,
#: started with whatever preload was set last, so each launch checks that the running one suits it.
_server: tuple[int, tuple[str, ...]] | None = None
#: modules later launches of this process will ask for (expect_preload)
_expected: list[str] = []


def expect_preload(modules: Sequence[str]) -> None:
    """Modules later launches of this process will ask for. A forkserver this process starts imports them too, so
    the first one serves every later launch instead of being replaced by a bigger one (each start imports the
    whole preload again). The pytest plugin says what the session's scenario items need before any test launches:
    a test that runs an hf row first would otherwise start a server the Megatron rows must replace."""
    _expected[:] = list(dict.fromkeys([*_expected, *modules]))


def _ensure_forkserver(preload: Sequence[str], exclude: Sequence[str] = ()) -> None:
    """A running forkserver that imported every module of `preload` and no module under a top-level name in
    `exclude`. One that does not (started by another launcher of this process, e.g. for hf rows only after an
    in-process `parity run` closed the first server, or one holding megatron when MindSpeed must patch it first)
    is restarted with `preload`: otherwise every Megatron rank imports megatron.core itself."""
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
    megatron.core) run on another core while the caller imports the runner and the judge (torch).
    Returns at once; the first launch waits for the server if it is still importing."""
    _ensure_forkserver(preload, exclude)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While ranks start, the caller's __main__ has neither a file nor a module name, so multiprocessing does not
    make each rank import it again (as __mp_main__): a rank needs only parity's own importable modules, and under
    `parity run` that import (the CLI, the reports, matplotlib) would be a large share of every tiny scenario. The
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
        server = _server[0] if _server is not None else os.getpid()
        procs = [self._mp.Process(target=_forked_rank, args=(job, r, world_size, store.port, timeout_s, server),
                                  daemon=False) for r in range(world_size)]
        with _main_module_hidden():
            for proc in procs:
                proc.start()
        try:
            status, error, log_tail = self._wait(procs, record_dir, started + timeout_s, timeout_s)
        finally:
            for proc in procs:
                _kill_group(proc.pid)
                proc.join(timeout=5)
            _kill_ranks(record_dir)
            del store
        return LaunchResult(status, time.perf_counter() - started, error, log_tail)

    @staticmethod
    def _wait(procs: list[Any], record_dir: Path, deadline: float,
              timeout_s: float) -> tuple[LaunchStatus, str | None, str | None]:
        """Wake on each rank's exit (its sentinel) and note when and how it ended. The first death (non-zero
        exit, or an exit without the done marker) gives the others GRACE_S to end by themselves."""
        from multiprocessing.connection import wait

        sentinels = {proc.sentinel: rank for rank, proc in enumerate(procs)}
        endings: dict[int, Ending] = {}
        failed_at: float | None = None
        while len(endings) < len(procs):
            now = time.perf_counter()
            until = deadline if failed_at is None else min(deadline, failed_at + GRACE_S)
            if now >= until:
                break
            for sentinel in wait([s for s, r in sentinels.items() if r not in endings], timeout=until - now):
                rank = sentinels[sentinel]
                code = procs[rank].exitcode
                endings[rank] = Ending(time.time(), code)
                if failed_at is None and (code != 0 or not finished(record_dir, rank)):
                    failed_at = time.perf_counter()
        if failed_at is None and len(endings) == len(procs):
            return "ok", None, None
        if failed_at is None:
            return "timeout", f"killed after its timeout ({timeout_s:g} s)", _logs_tail(record_dir, None)
        spared = frozenset(r for r in range(len(procs)) if r not in endings)
        error, log_tail = _failure(record_dir, len(procs), endings, spared, "a rank died")
        return "error", error, log_tail


def torchrun_commands(layout: Layout, job_file: Path, master_addr: str, port: int, run_id: str,
                      python: str = sys.executable, rdzv: str = "static") -> list[list[str]]:
    """One torchrun command per node. Static rendezvous: global ranks follow --node-rank, so rank 0 (which
    writes the record) is always on node 0, the node that compares and reports. c10d: the agents meet at one TCP
    store on the endpoint and are ranked as they join (torch.distributed.elastic's c10d handler; --node-rank is
    not theirs to choose), as verl's multi-node jobs run."""
    commands = []
    for node in range(layout.nodes):
        placement = [f"--node-rank={node}"] if rdzv == "static" else []
        commands.append([
            python, "-m", "torch.distributed.run", f"--nnodes={layout.nodes}", *placement,
            f"--nproc-per-node={layout.ranks_per_node}", f"--rdzv-backend={rdzv}",
            f"--rdzv-endpoint={master_addr}:{port}", f"--rdzv-id={run_id}", "--max-restarts=0",
            "-m", "parity.harness.run.worker", "--job", str(job_file)])
    return commands


class TorchrunLauncher:
    """One torchrun per node on this host (multi-node on loopback for CPU tests; node 0 on real clusters)."""

    def __init__(self, master_addr: str = "127.0.0.1", nodes_here: Sequence[int] | None = None,
                 master_port: int | None = None, rdzv: str = "static") -> None:
        self.master_addr = master_addr
        self.nodes_here = nodes_here
        self.master_port = master_port
        self.rdzv = rdzv

    def launch(self, job: RunJob, layout: Layout, timeout_s: float) -> LaunchResult:
        record_dir = _fresh_record_dir(job)
        job_file = record_dir / JOB
        job.to_file(job_file)
        port = self.master_port or free_port()
        commands = torchrun_commands(layout, job_file, self.master_addr, port, job.run_id.replace("/", "_"),
                                     rdzv=self.rdzv)
        nodes = list(self.nodes_here) if self.nodes_here is not None else list(range(layout.nodes))
        started = time.perf_counter()
        procs = []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(job.visible_devices or {})}
        header = ""
        if layout.nodes > 1:  # a single-node run talks over loopback and the card links: nothing to pin
            try:
                interface = node_interface(self.master_addr, port, env)
            except InterfaceError as exc:
                return LaunchResult("error", 0.0, f"refused to launch: {exc}")
            env |= interface.env
            header = f"parity: {interface.describe()}\n"
        watch = _RankWatch(record_dir)
        for node in nodes:
            log = open(record_dir / f"node{node}.log", "w")  # noqa: SIM115 - closed with the process
            log.write(header)
            log.flush()
            procs.append((subprocess.Popen(commands[node], stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True, preexec_fn=_term_with_parent()), log))
        try:
            status, error, log_tail = wait_all(
                [p.poll for p, _ in procs], [f"torchrun on node {n}" for n in nodes], started + timeout_s,
                lambda i: tail(record_dir / f"node{nodes[i or 0]}.log"), timeout_s, watch.poll)
            if status == "error":
                for proc, _ in procs:  # a torchrun still running (another node) gets its workers' ends reported
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=GRACE_S)
                watch.poll()
                endings, spared = watch.torchrun_view(record_dir.glob("node*.log"))
                error, log_tail = _failure(record_dir, layout.world_size, endings, spared, error)
        finally:
            for proc, log in procs:
                _kill_group(proc.pid)
                proc.wait(timeout=10)
                log.close()
            _kill_ranks(record_dir)
        return LaunchResult(status, time.perf_counter() - started, error, log_tail)


def _term_with_parent() -> Callable[[], None] | None:
    """A Popen preexec_fn that has the kernel send SIGTERM to torchrun when the harness dies, however (torchrun
    then stops its workers; each worker also dies with torchrun: worker.die_with_parent). Linux only."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def arm() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG

    return arm


#: torchrun's failure report (torch/distributed/elastic/multiprocessing/errors/__init__.py) and its log line when
#: it stops the other workers (elastic/multiprocessing/api.py, _close)
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_TORCHRUN_CLOSING = re.compile(r"Sending process (\d+) closing signal")


class _RankWatch:
    """torchrun's workers are not this process's children: when each ended is seen by polling their pids (each
    writes rank<N>.pid), their exit codes come from torchrun's failure report."""

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = record_dir
        self.pids: dict[int, int] = {}
        self.gone: dict[int, float] = {}

    def poll(self) -> bool:
        for pid_file in self.record_dir.glob("rank*.pid"):
            with contextlib.suppress(OSError, ValueError):
                self.pids.setdefault(int(pid_file.stem.removeprefix("rank")), int(pid_file.read_text()))
        for rank, pid in self.pids.items():
            if rank not in self.gone and not _running(pid):
                self.gone[rank] = time.time()
        return False  # torchrun itself exits when a worker dies: its exit ends the wait

    def torchrun_view(self, logs: Iterable[Path]) -> tuple[dict[int, Ending], frozenset[int]]:
        """(how each rank ended, ranks torchrun closed itself after the first failure)."""
        codes: dict[int, int] = {}
        closed: set[int] = set()
        for log in logs:
            text = log.read_text(errors="replace")
            codes |= {int(rank): int(code) for rank, code in _TORCHRUN_FAILURE.findall(text)}
            closed |= {int(pid) for pid in _TORCHRUN_CLOSING.findall(text)}
        now = time.time()
        endings = {rank: Ending(self.gone.get(rank, now), codes.get(rank)) for rank in self.pids if
                   rank in self.gone or rank in codes}
        spared = frozenset(rank for rank, pid in self.pids.items() if pid in closed and rank not in codes)
        return endings, spared


def _running(pid: int) -> bool:
    """Alive and not a zombie (a worker torchrun has not reaped yet is dead to us)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
