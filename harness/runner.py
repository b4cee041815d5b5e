"""Run scenarios: skip what cannot run here, compute (or reuse) references, launch the candidate, judge.

The runner returns Verdicts through a callback as each scenario finishes; it renders nothing itself.
One scenario's crash, hang or NaN becomes that scenario's ERROR/FAIL and never stops the others.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.launch import ForkedLauncher, LaunchResult, TorchrunLauncher
from harness.records import RunRecord
from harness.reference import baseline_scenario, cache_key, golden_dir, reference_scenario
from harness.schema import Scenario
from harness.validate import skip_reason
from harness.verdict import Verdict, errored, judge, skipped
from harness.worker import RunJob

MEGATRON_STRATEGIES = {"megatron", "mindspeed_megatron"}


@dataclass(frozen=True, slots=True)
class RunOptions:
    out_dir: Path = Path("parity-out")
    cache_dir: Path = Path(".parity-cache")
    launcher: Literal["forked", "torchrun"] = "forked"


def slug(run_id: str) -> str:
    return run_id.replace("/", "__").replace(":", "_")


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
        self._commit = harness_commit()

    def run(self, scenarios: Iterable[Scenario], on_result: Callable[[Verdict], None] | None = None) -> list[Verdict]:
        verdicts = []
        for scenario in scenarios:
            verdict = self.run_scenario(scenario)
            verdicts.append(verdict)
            if on_result:
                on_result(verdict)
        return verdicts

    def run_scenario(self, scenario: Scenario) -> Verdict:
        reason = skip_reason(scenario)
        if reason:
            return skipped(scenario, reason)
        reference = self._reference(scenario)
        if not reference.ok:
            return errored(scenario, reference, "reference")
        baseline = None
        if (base := baseline_scenario(scenario)) is not None:
            baseline = self._cached(base, "baseline")
            if not baseline.ok:
                return errored(scenario, baseline, "baseline")
        candidate = self.execute(scenario, scenario.id, self.options.out_dir / "records" / slug(scenario.id))
        if not candidate.ok:
            return errored(scenario, candidate)
        try:
            verdict = judge(scenario, candidate, reference, baseline)
        except (KeyError, ValueError) as exc:  # a record without the tensors the comparison needs
            candidate.status, candidate.error = "error", f"cannot compare: {exc}"
            return errored(scenario, candidate)
        verdict.info["reference_wall_time_s"] = reference.wall_time_s
        return verdict

    def _reference(self, scenario: Scenario) -> RunRecord:
        ref = reference_scenario(scenario)
        if ref is None:
            return RunRecord.load(golden_dir(scenario))
        return self._cached(ref, "reference")

    def _cached(self, run: Scenario, kind: str) -> RunRecord:
        key = cache_key(run)
        if key in self._references:
            return self._references[key]
        directory = self.options.cache_dir / "refs" / f"{slug(run.id)}-{key}"
        if (directory / "record.json").is_file():
            record = RunRecord.load(directory)
        else:
            record = self.execute(run, f"{kind}:{run.id}", directory)
        self._references[key] = record
        return record

    def execute(self, scenario: Scenario, run_id: str, record_dir: Path) -> RunRecord:
        """Launch one run and collect its RunRecord (a failed one when the ranks did not finish)."""
        for stale in ("record.json", "tensors.safetensors"):
            (record_dir / stale).unlink(missing_ok=True)
        job = RunJob(run_id=run_id, scenario=scenario.model_dump(mode="json"), record_dir=str(record_dir),
                     cache_dir=str(self.options.cache_dir.resolve()),
                     provenance={"harness_commit": self._commit, "scenario_hash": scenario.content_hash(),
                                 "launcher": self._launcher_name(scenario),
                                 "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
        started = time.perf_counter()
        result = self._launch(job, scenario)
        if result.status == "ok" and (record_dir / "record.json").is_file():
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

    def _launcher_name(self, scenario: Scenario) -> str:
        return "torchrun" if self.options.launcher == "torchrun" or scenario.layout.nodes > 1 else "forked"

    def _launch(self, job: RunJob, scenario: Scenario) -> LaunchResult:
        if self._launcher_name(scenario) == "torchrun":
            return TorchrunLauncher().launch(job, scenario.layout, scenario.timeout)
        if self._forked is None:
            preload = ["torch", "harness.preload"]
            if any(s.strategy in MEGATRON_STRATEGIES for s in [*self._planned, scenario]):
                preload.append("engines.megatron")
            self._forked = ForkedLauncher(preload)
        return self._forked.launch(job, scenario.layout.world_size, scenario.timeout)
