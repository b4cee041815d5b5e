"""Run options defined once for both the `parity` CLI and the pytest plugin (prefix 'parity-' there)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from parity.harness.config import paths
from parity.harness.config.errors import ScenarioError
from parity.harness.run.preload import forks_here, launcher_for

if TYPE_CHECKING:
    from parity.harness.contract.schema import Scenario


@dataclass(frozen=True, slots=True)
class RunOptions:
    out_dir: Path = paths.OUT
    cache_dir: Path = paths.CACHE
    launcher: Literal["forked", "torchrun"] = "forked"
    node_rank: int | None = None
    """Multi-node: the node this process launches (None = every node, on this host). Only node 0 judges."""
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    """Rendezvous port all nodes agree on (required with node_rank; a free port otherwise)."""
    rdzv: Literal["static", "c10d"] = "static"
    """torchrun's rendezvous: static (node ranks as given, rank 0 on node 0) or c10d (the agents join one TCP store
    and are ranked as they join: verl's multi-node runs; rank 0 may land on any node, so its record directory must
    be shared, as on one host)."""
    history: tuple[Path, ...] = ()
    """Earlier runs' out dirs that perf gates (a scenario's `perf:`) compare with."""
    require: tuple[Path, ...] = ()
    """Scenario files whose rows must run here: a row of one that would SKIP (other than `broken`) is an ERROR."""
    recheck_cached: int = 1
    """Cached references and baselines this run recomputes and compares bit for bit with the stored entry (the first
    ones it loads): a mismatch is refused (the entry removed, the scenarios judged against it ERROR)."""

    def required(self, scenario: Scenario) -> bool:
        return scenario.source is not None and Path(scenario.source).resolve() in {p.resolve() for p in self.require}

    def launcher_for(self, scenario: Scenario) -> Literal["forked", "torchrun"]:
        return launcher_for(scenario, self.launcher, self.node_rank)

    def forks_here(self, scenarios: list[Scenario]) -> bool:
        return forks_here(scenarios, self.launcher, self.node_rank)

    @property
    def judges(self) -> bool:
        return self.node_rank in (None, 0)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("device", {"choices": ["cpu", "cuda", "npu"], "default": None,
                "help": "run every scenario on this device (the fp32 reference stays on CPU)"}),
    ("out", {"default": str(paths.OUT),
             "help": f"output directory ({paths.RESULTS}, {paths.SUMMARY}, {paths.RECORDS}/)"}),
    ("cache-dir", {"default": str(paths.CACHE), "help": "tiny model checkpoints and cached reference runs"}),
    ("launcher", {"choices": ["forked", "torchrun"], "default": "forked",
                  "help": "forked: ranks forked from a warm forkserver (fast); torchrun: one torchrun per run"}),
    ("node-rank", {"type": int, "default": None,
                   "help": "multi-node: launch only this node's ranks (run once per node; node 0 reports)"}),
    ("master-addr", {"default": "127.0.0.1", "help": "multi-node: address of node 0 (rendezvous host)"}),
    ("master-port", {"type": int, "default": None, "help": "multi-node: rendezvous port, the same on every node"}),
    ("rdzv", {"choices": ["static", "c10d"], "default": "static",
              "help": "multi-node: torchrun rendezvous (static: rank 0 on node 0; c10d: agents ranked as they join, "
                      "records on a shared directory)"}),
    ("shard", {"default": None, "metavar": "I/N",
               "help": "run only shard I of N (deterministic, even by expected cost); `parity report` merges them"}),
    ("history", {"action": "append", "default": None, "metavar": "DIR",
                 "help": "an earlier run's out dir (repeat it): scenarios with `perf:` gates compare with them"}),
    ("require", {"action": "append", "default": None, "metavar": "FILE",
                 "help": "a scenario file whose rows must run here (repeat it): a row that would SKIP (missing "
                         "package, device, ...; not one marked broken) is an ERROR instead. CI: a green run where "
                         "half the matrix skipped is not green"}),
    ("recheck-cached", {"type": int, "default": 1, "metavar": "N",
                        "help": "recompute the first N cached references / baselines this run loads and refuse one "
                                "that differs bit for bit (0: trust the cache)"}),
]


def add_options(add: Callable[..., Any], prefix: str = "") -> None:
    for name, kwargs in OPTIONS:
        add(f"--{prefix}{name}", **kwargs)


def run_options(get: Callable[[str], Any]) -> RunOptions:
    """Build RunOptions from a getter of option values by dest name ('out', 'cache_dir', ...)."""
    node_rank, port = get("node_rank"), get("master_port")
    if node_rank is not None and port is None:
        raise ScenarioError("--node-rank needs --master-port (every node must use the same rendezvous port)")
    out, history = Path(get("out")), tuple(Path(d) for d in get("history") or ())
    for earlier in history:  # refused before anything is deleted: a run starts by resetting its out dir
        if earlier.resolve() == out.resolve():
            raise ScenarioError(f"--history {earlier} is also the --out directory: this run would replace the "
                                "results it compares with. Give the new run another --out")
    required = tuple(Path(f) for f in get("require") or ())
    for path in required:
        if not path.is_file():
            raise ScenarioError(f"--require {path}: no such scenario file")
    return RunOptions(out_dir=out, cache_dir=Path(get("cache_dir")), launcher=get("launcher"),
                      node_rank=node_rank, master_addr=get("master_addr"), master_port=port, rdzv=get("rdzv"),
                      history=history,
                      require=required, recheck_cached=get("recheck_cached"))


def writable_out_dir(out_dir: Path, option: str = "--out") -> None:
    """Create the out dir and write a file in it, or raise ScenarioError saying why (a file in the way, no
    permission, a read-only or full file system): checked before any scenario runs, not at the first result."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ScenarioError(f"{option} {out_dir}: a file is there; the results need a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".parity-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != os.fspath(out_dir) else ""
        raise ScenarioError(f"{option} {out_dir}: cannot write there: {reason}{where}") from None
