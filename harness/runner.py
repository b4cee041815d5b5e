"""Run scenarios: skip what cannot run here, compute (or reuse) references, launch the candidate, judge.

The runner returns one scenario's Verdict at a time (harness/session.py runs a selection); it renders nothing
itself. One scenario's crash, hang or NaN becomes that scenario's ERROR/FAIL and never stops the others.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path

from parity.harness.config import devices, paths
from parity.harness.config.errors import ScenarioError
from parity.harness.config.registry import SPECS
from parity.harness.config.validate import broken_here, skip_reason
from parity.harness.contract.schema import Scenario
from parity.harness.judge import drift
from parity.harness.judge.golden import integrity as golden_integrity
from parity.harness.judge.golden import manifest_of
from parity.harness.judge.reference import (
    REFERENCE_CODE,
    Sources,
    baseline_scenario,
    cache_key,
    golden_dir,
    golden_mismatch,
    reference_scenario,
    run_identity,
    source_files,
)
from parity.harness.judge.verdict import Verdict, errored, failed, judge, scenario_info, skipped
from parity.harness.options import RunOptions
from parity.harness.run import ref_cache
from parity.harness.run.cards import CardPool, Oversubscribed, host_ranks
from parity.harness.run.launch import ForkedLauncher, LaunchResult, TorchrunLauncher
from parity.harness.run.preload import forkserver_preload
from parity.harness.run.records import RunRecord
from parity.harness.run.staged import checkpointed_run
from parity.harness.run.worker import RunJob, Stage, package_versions
from parity.reports import history


def load_history(directories: Iterable[Path]) -> dict[str, list[dict]]:
    """Scenario id -> its results (metrics, provenance) in each earlier run that measured it, oldest first, for perf
    gates: the runs as `parity history` reads them (reports/history.py load_runs)."""
    runs = []
    for directory in directories:
        try:
            runs += history.load_runs([directory])
        except (OSError, ValueError) as exc:
            raise ScenarioError(f"--history {directory}: cannot read its results ({exc})") from None
    past: dict[str, list[dict]] = {}
    for run in history.chronological(runs):
        for result in run.results.values():
            if result.get("verdict") in ("PASS", "FAIL"):
                past.setdefault(result["id"], []).append(result)
    return past


def harness_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Runner:
    """Holds the warm launcher and the reference cache for one harness invocation."""

    def __init__(self, options: RunOptions, planned: Iterable[Scenario] = ()) -> None:
        self.options = options
        self._planned = list(planned)
        self._forked: ForkedLauncher | None = None
        self._references: dict[str, RunRecord] = {}
        # before the forkserver imports anything: the code the ranks run, for every key this run may take
        self._sources = Sources().snapshot(source_files((*REFERENCE_CODE, *(m for spec in SPECS.values()
                                                                             for m in spec.modules))))
        self._rechecks_left = options.recheck_cached
        self._commit = harness_commit()
        self._history = load_history(options.history)

    def close(self) -> None:
        """Stop the warm forkserver (a later run starts a new one)."""
        if self._forked is not None:
            self._forked.close()
            self._forked = None

    def run_scenario(self, scenario: Scenario) -> Verdict:
        """One scenario's verdict. Whatever goes wrong while collecting, comparing or judging it (an unreadable
        golden, a card lease that timed out, a record the comparison cannot read) ERRORs this scenario only."""
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        try:
            verdict = self._run_scenario(scenario)
        except Exception as exc:  # isolation is the point: the run goes on
            verdict = failed(scenario, "running", exc)
        if not verdict.info.get("provenance"):  # SKIP / ERROR rows too: `parity history` orders runs by them
            verdict.info["provenance"] = {"started": started, "harness_commit": self._commit,
                                          "scenario_hash": scenario.content_hash(), "versions": package_versions()}
        return verdict

    def _run_scenario(self, scenario: Scenario) -> Verdict:
        reason = skip_reason(scenario)
        if reason and self.options.required(scenario) and broken_here(scenario) is None:
            return Verdict(scenario.id, "ERROR", [f"required to run here (--require {scenario.source}) but it would "
                                                  f"SKIP: {reason}"], info=scenario_info(scenario))
        if reason:
            return skipped(scenario, reason)
        if not self.options.judges:
            return self._run_other_node(scenario)
        reference = self._reference(scenario)
        if not reference.ok:
            return errored(scenario, reference, "reference")
        baseline = None
        if (base := baseline_scenario(scenario)) is not None:
            baseline = self._cached(base, "baseline")
            if not baseline.ok:
                return errored(scenario, baseline, "baseline")
        uninterrupted = None
        if scenario.resume is not None or scenario.convert:  # through the engine's own checkpoint
            candidate, uninterrupted = checkpointed_run(self.execute, scenario, self._record_dir(scenario))
            if candidate.ok:
                candidate.save(self._record_dir(scenario))
        else:
            candidate = self.execute(scenario, scenario.id, self._record_dir(scenario))
        if not candidate.ok:
            return errored(scenario, candidate)
        repeats = []
        for i in range(2, scenario.repeat + 1):  # deterministic lane: the same run again, bit for bit
            again = self.execute(scenario, f"{scenario.id}#{i}", self._record_dir(scenario) / f"repeat{i}")
            if not again.ok:
                return errored(scenario, again, f"repeat {i}")
            repeats.append(again)
        try:
            verdict = judge(scenario, candidate, reference, baseline, repeats, uninterrupted)
        except Exception as exc:  # e.g. a record without the tensors the comparison needs
            return failed(scenario, "comparing", exc)
        verdict.info["reference_wall_time_s"] = reference.wall_time_s
        if scenario.reference.startswith("golden:") and manifest_of(golden_dir(scenario)) is None:
            verdict.info.setdefault("warnings", []).append(
                f"golden {golden_dir(scenario)} has no manifest.json: its content is not verified (goldens "
                "recorded with `parity golden record` are)")
        verdict = drift.gate(verdict, scenario.perf, self._history.get(scenario.id, []))
        return verdict

    def _run_other_node(self, scenario: Scenario) -> Verdict:
        """Node > 0 of a multi-node job: launch this node's ranks; node 0 compares and reports."""
        node = self.options.node_rank
        if scenario.layout.nodes <= (node or 0):
            return skipped(scenario, f"single-node scenario: it runs on node 0, not node {node}")
        result = self._launch(self._job(scenario, scenario.id, self._record_dir(scenario)), scenario)
        if result.status != "ok":
            record = RunRecord.failed(scenario.id, scenario.content_hash(), result.status, result.error or "",
                                      result.log_tail)
            return errored(scenario, record)
        return skipped(scenario, f"node {node}: its ranks finished; node 0 compares and reports")

    def _reference(self, scenario: Scenario) -> RunRecord:
        ref = reference_scenario(scenario)
        if ref is None:
            if problems := golden_integrity(golden_dir(scenario)):
                return RunRecord.failed("golden", "", "error", f"golden {golden_dir(scenario)} is not the one its "
                                        f"manifest pins: {'; '.join(problems)}")
            try:
                golden = RunRecord.load(golden_dir(scenario))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                return RunRecord.failed("golden", "", "error", f"cannot read golden {golden_dir(scenario)}: {exc}")
            if problems := golden_mismatch(golden.provenance, scenario):
                return RunRecord.failed("golden", "", "error", f"golden {golden_dir(scenario)} does not match the "
                                        f"scenario: {'; '.join(problems)}")
            return golden
        return self._cached(ref, "reference")

    def _cached(self, run: Scenario, kind: str) -> RunRecord:
        key = cache_key(run, self._sources)
        if key in self._references:
            return self._references[key]
        directory = paths.reference_dir(self.options.cache_dir, run.id, key)
        stored = ref_cache.load(directory)
        if stored is not None and self._rechecks_left > 0:
            self._rechecks_left -= 1
            record = self._recheck(run, kind, directory, stored)
        else:
            record = ref_cache.get_or_compute(directory, lambda where: self.execute(run, f"{kind}:{run.id}", where),
                                              self._tree_changed)
        self._references[key] = record
        return record

    def _tree_changed(self) -> str | None:
        changed = self._sources.changed()
        if not changed:
            return None
        names = ", ".join(str(path) for path in changed[:3]) + (f" (+{len(changed) - 3})" if len(changed) > 3 else "")
        return f"the source tree changed during this session ({names}): the ranks may have run other code"

    def _recheck(self, run: Scenario, kind: str, directory: Path, stored: RunRecord) -> RunRecord:
        """Recompute a cached entry and compare bit for bit: a cache that holds what did not run is refused."""
        where = directory.with_name(f".{directory.name}.recheck{os.getpid()}")
        try:
            again = self.execute(run, f"{kind}-recheck:{run.id}", where)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        if not again.ok:
            return again
        if (why := ref_cache.differs(stored, again)) is None:
            return stored
        ref_cache.remove(directory)
        return RunRecord.failed(run.id, run.content_hash(), "error",
                                f"cached {kind} {directory} is not what recomputing it gives ({why}): refused, and "
                                "the entry removed")

    def _record_dir(self, scenario: Scenario) -> Path:
        return paths.record_dir(self.options.out_dir, scenario.id)

    def _job(self, scenario: Scenario, run_id: str, record_dir: Path, stage: Stage | None = None) -> RunJob:
        return RunJob(run_id=run_id, scenario=scenario.model_dump(mode="json"), record_dir=str(record_dir),
                      stage=None if stage is None else asdict(stage),
                      cache_dir=str(self.options.cache_dir.resolve()),
                      provenance={**run_identity(scenario), "harness_commit": self._commit,
                                  "scenario_hash": scenario.content_hash(),
                                  "launcher": self.options.launcher_for(scenario),
                                  "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})

    def execute(self, scenario: Scenario, run_id: str, record_dir: Path, stage: Stage | None = None) -> RunRecord:
        """Launch one run (or one Stage of it) and collect its RunRecord (a failed one when the ranks did not
        finish)."""
        for stale in paths.RECORD_FILES:
            (record_dir / stale).unlink(missing_ok=True)
        started = time.perf_counter()
        result = self._launch(self._job(scenario, run_id, record_dir, stage), scenario)
        if result.status == "ok" and (record_dir / paths.RECORD).is_file():
            record = RunRecord.load(record_dir)
        elif result.status == "ok":
            record = RunRecord.failed(run_id, scenario.content_hash(), "error", "ranks exited 0 without a record")
        else:
            record = RunRecord.failed(run_id, scenario.content_hash(), result.status, result.error or "",
                                      result.log_tail)
        record.wall_time_s = time.perf_counter() - started
        if record.ok:
            record.save(record_dir)
        return record

    def _launch(self, job: RunJob, scenario: Scenario) -> LaunchResult:
        """Lease this node's cards (accelerators only), then launch with the right launcher."""
        lease = None
        if scenario.device != "cpu":
            count, _ = devices.availability(scenario.device)
            try:  # one card per rank started here, or nothing starts
                ranks = host_ranks(scenario.layout, self.options.node_rank, scenario.device)
                lease = CardPool(scenario.device, count).lease(ranks, scenario.timeout)
            except Oversubscribed as exc:
                return LaunchResult("error", 0.0, f"refused to launch: {exc}")
            job = replace(job, visible_devices=lease.visible_env(scenario.device))
        try:
            if self.options.launcher_for(scenario) == "torchrun":
                # the rendezvous port and this node's share belong to runs spanning nodes: a single-node run on
                # node 0 (its reference, a baseline, a recheck of either) takes a port of its own, or the other
                # nodes' agents would join it
                spans = scenario.layout.nodes > 1
                nodes_here = None if self.options.node_rank is None or not spans else [self.options.node_rank]
                launcher = TorchrunLauncher(self.options.master_addr, nodes_here,
                                            self.options.master_port if spans else None, self.options.rdzv)
                return launcher.launch(job, scenario.layout, scenario.timeout)
            return self._forked_launcher(scenario).launch(job, scenario.layout.world_size, scenario.timeout)
        finally:
            if lease is not None:
                lease.release()

    def _forked_launcher(self, scenario: Scenario) -> ForkedLauncher:
        if self._forked is None:
            self._forked = ForkedLauncher(*self.forkserver_preload(scenario))
        return self._forked

    def forkserver_preload(self, scenario: Scenario) -> tuple[list[str], list[str]]:
        """What the warm forkserver imports (and must not) for the planned scenarios that can run here, plus
        this one."""
        return forkserver_preload([*self._planned, scenario])
