"""One run of a selection, from its scenarios to its exit code: the flow that `parity run`, the pytest plugin,
`parity golden record` and `parity calibrate` all drive, so each of them is wiring only.

    select -> start the forkserver's imports -> run each scenario (Runner) -> stream each result as it comes
    (results.jsonl, a progress line, the report's figures) -> publish (terminal table, summary.md, report.html,
    $GITHUB_STEP_SUMMARY; the pytest plugin adds JUnit properties) -> exit code

SIGTERM / SIGINT while a scenario runs end it as ERROR (its launcher kills the ranks on the way out); what finished
is published and the exit code is 128 + the signal. Shards are merged here: the out dirs of `--shard I/N` runs
(`parity report`) and the pytest-xdist workers' OUT/gw* at the end of the session. Importing this module imports
neither torch nor matplotlib: the runner, the judge and the report pages come when a run needs them.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from parity.harness.config import paths
from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import check_runnable, scenario_files, select
from parity.harness.config.shard import Shard, split
from parity.harness.contract.schema import Scenario
from parity.harness.options import RunOptions, writable_out_dir
from parity.harness.run.launch import start_forkserver
from parity.harness.run.preload import forkserver_preload
from parity.reports import results as results_file

if TYPE_CHECKING:
    from parity.harness.judge.verdict import Verdict
    from parity.harness.runner import Runner
    from parity.reports.early_figures import EarlyFigures
    from parity.reports.progress import RunProgress

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
JUNIT_METRICS = ("logprob_max_abs", "logprob_mean_abs", "loss_rel_max", "grad_norm_rel_max", "step_time_s",
                 "peak_memory_mb")
"""The metrics a pytest session puts into its JUnit XML as properties of each scenario item."""

Step = Callable[["Runner", Scenario], "Verdict"]
"""What running one scenario means: judging it (Runner.run_scenario) or, for `golden record`, keeping its record."""


class Interrupted(BaseException):
    """SIGTERM / SIGINT reached the harness. A BaseException, so per-scenario isolation (`except Exception`) does
    not swallow it: the launchers' `finally` kill the ranks, the session records the scenario and stops."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def selection(files: Sequence[str], keyword: str | None, device: str | None,
              shard: str | None = None) -> list[Scenario]:
    """The scenarios a command runs: loaded, checked, selected by -k, this shard's share; each that will run here
    passes its environment check (a bad one is bad input before anything starts)."""
    scenarios = select(scenario_files(list(files)), keyword, device)
    if not scenarios:
        raise ScenarioError(f"no scenario matches -k {keyword!r}" if keyword else "the files hold no scenarios")
    if shard:
        part = Shard.parse(shard)
        total, scenarios = len(scenarios), split(scenarios, part)
        print(f"shard {part.index}/{part.count}: {len(scenarios)} of {total} scenarios", flush=True)
    check_runnable(scenarios)
    return scenarios


def exit_code(results: Iterable[dict[str, Any]]) -> int:
    return EXIT_FAILED if any(r["verdict"] in ("FAIL", "ERROR") for r in results) else EXIT_OK


def junit_properties(verdict: Verdict) -> list[tuple[str, Any]]:
    return [*((key, verdict.metrics[key]) for key in JUNIT_METRICS if key in verdict.metrics),
            ("verdict", verdict.status)]


def merge(directories: Sequence[Path], out: Path) -> list[dict[str, Any]]:
    """The results of several out dirs (shards; a later line for the same id wins), written to OUT/results.jsonl
    unless OUT is one of them. Unreadable results are bad input."""
    try:
        merged = results_file.load(list(directories))
    except (FileNotFoundError, ValueError) as exc:
        raise ScenarioError(f"cannot read results: {exc}") from None
    if out.resolve() not in [d.resolve() for d in directories]:
        results_file.reset(out)
        for result in merged:
            results_file.append(out, result)
    return merged


class Session:
    """One run of a selection. Each result streams as its scenario finishes; `publish` renders them at the end.

    planned: the scenarios the session will run (the forkserver preloads for them). step: what running one means
    (default: judging it, Runner.run_scenario). stream_results: append each to OUT/results.jsonl; figures: draw
    the report's figures in the background as results come; progress: a line per result (and a bar on a
    terminal); on_result: the driver's own callback per result. Under pytest-xdist a `worker` ('gw0') writes into
    OUT/gw0 and publishes nothing; the `controller` runs nothing, removes the shards of earlier runs at the start
    and merges its workers' shards when it publishes. out_option: the option that named OUT, for messages."""

    def __init__(self, options: RunOptions, planned: Sequence[Scenario] = (), *, step: Step | None = None,
                 stream_results: bool = True, figures: bool = True, progress: bool = False,
                 on_result: Callable[[Verdict], None] | None = None, worker: str | None = None,
                 controller: bool = False, out_option: str = "--out") -> None:
        self.out_dir = options.out_dir
        """Where the session publishes (a worker's results go to its own shard below it)."""
        self.options = replace(options, out_dir=options.out_dir / worker) if worker else options
        self.planned = list(planned)
        """The scenarios this session will run: the forkserver preloads for them."""
        self.worker, self.controller = worker, controller
        self.results: list[dict[str, Any]] = []
        self.running = False
        """A scenario's ranks are running: a signal must go through its launcher's cleanup."""
        self._step = step
        self._stream_results = stream_results
        self._on_result = on_result
        self._early: EarlyFigures | None = None
        self._figures = figures and not worker  # the controller draws the page
        self._progress: RunProgress | None = None
        self._want_progress = progress
        self._runner: Runner | None = None
        self._opened = False
        self._out_option = out_option
        self._started = time.perf_counter()
        if controller:
            for stale in self.out_dir.glob(paths.WORKER_SHARDS):
                shutil.rmtree(stale, ignore_errors=True)

    # -- the whole flow, for a command ------------------------------------------------------------------------

    def run_and_publish(self) -> int:
        """Run every planned scenario, publish, and return the exit code: 0, 1 when one FAILed or ERRORed, 128 + N
        after signal N. An out dir that stops taking writes is bad input, after the table of what finished."""
        self.open()
        self.start_forkserver()
        self._build_runner()  # after the forkserver started (torch); reading --history may be bad input
        print(f"running {len(self.planned)} scenarios -> {self.options.out_dir}/", flush=True)
        try:
            stopped = self.run_all()
            self.publish()
        except OSError as exc:  # the out dir stopped taking writes (disk full, removed): say so, show what finished
            self.close()
            self.abandon_figures()
            from parity.reports.terminal import print_report

            print_report(self.results, self.elapsed())
            raise ScenarioError(f"--out {self.options.out_dir}: cannot write the results: {exc}") from None
        if stopped is not None:
            print(f"parity: {stopped}", file=sys.stderr)
            return 128 + stopped.signum
        return exit_code(self.results)

    def run_all(self, scenarios: Sequence[Scenario] | None = None) -> Interrupted | None:
        """Run the scenarios (default: the planned ones) in turn, streaming each result; the signal that stopped
        them, if one did (the running scenario is then recorded as ERROR and the warm forkserver stopped)."""
        from parity.reports.progress import RunProgress

        scenarios = self.planned if scenarios is None else scenarios
        self.open()
        progress = RunProgress(len(scenarios)) if self._want_progress else contextlib.nullcontext()
        try:
            with self.signals(), progress as shown:
                self._progress = shown
                for scenario in scenarios:
                    self.run(scenario)
        except Interrupted as exc:
            self.close()
            return exc
        finally:
            self._progress = None
        return None

    # -- the steps, for a driver that runs scenarios one at a time (the pytest plugin) ------------------------

    def open(self) -> None:
        """Check the out dir takes writes (ScenarioError saying why, before anything runs) and start its
        results.jsonl afresh."""
        if self._opened:
            return
        if self._stream_results:
            writable_out_dir(self.options.out_dir, self._out_option)
            results_file.reset(self.options.out_dir)
        self._opened = True

    def start_forkserver(self, scenarios: Sequence[Scenario] | None = None) -> None:
        """Start the warm forkserver's imports for these scenarios (default: the planned ones) now, before this
        process imports torch itself, when any of them forks ranks here."""
        scenarios = self.planned if scenarios is None else scenarios
        if scenarios and self.options.forks_here(scenarios):
            start_forkserver(*forkserver_preload(scenarios))

    @property
    def runner(self) -> Runner:
        return self._runner or self._build_runner()

    def _build_runner(self) -> Runner:
        from parity.harness.runner import Runner

        if self._runner is None:
            self._runner = Runner(self.options, self.planned)
        return self._runner

    def run(self, scenario: Scenario) -> Verdict:
        """Run (or skip) one scenario and stream its result. A signal while it runs records it as ERROR and
        raises Interrupted."""
        from parity.harness.judge.verdict import failed

        self.open()
        runner = self.runner
        self.running = True
        try:
            verdict = self._step(runner, scenario) if self._step else runner.run_scenario(scenario)
        except Interrupted as exc:  # the launcher killed the ranks on the way out
            self.running = False
            self.record(scenario, failed(scenario, "running", exc))
            raise
        finally:
            self.running = False
        return self.record(scenario, verdict)

    def record(self, scenario: Scenario, verdict: Verdict) -> Verdict:
        """Stream one result. A result that cannot be written is that scenario's ERROR, streamed in its place; a
        second failure (the out dir takes nothing) is raised."""
        from parity.harness.judge.verdict import failed

        try:
            self._stream(verdict)
        except Exception as exc:
            verdict = failed(scenario, "reporting", exc)
            self._stream(verdict, again=True)
        return verdict

    def _stream(self, verdict: Verdict, again: bool = False) -> None:
        result = verdict.to_json()
        if again and self.results and self.results[-1]["id"] == result["id"]:  # in place of the failed report
            self.results[-1] = result
        else:
            self.results.append(result)
            if self._progress is not None:
                self._progress.finished(result)
        if self._figures:
            if self._early is None:
                from parity.reports.early_figures import EarlyFigures

                self._early = EarlyFigures()
            self._early.submit(result)
        if self._on_result is not None:
            self._on_result(verdict)
        if self._stream_results:
            results_file.append(self.options.out_dir, result)

    @contextlib.contextmanager
    def signals(self, idle: Callable[[int], None] | None = None) -> Iterator[None]:
        """SIGTERM and SIGINT in the main thread for the duration: while a scenario runs they raise Interrupted
        (its launcher's `finally` kills the ranks); between scenarios `idle(signum)` decides (default: the same)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, _frame: Any) -> None:
            if self.running or idle is None:
                raise Interrupted(signum)
            idle(signum)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    # -- the end -----------------------------------------------------------------------------------------------

    def collected(self) -> list[dict[str, Any]]:
        """What to publish: this session's results, or (the xdist controller) its workers' shards merged."""
        if self.results or not self.controller:
            return self.results
        shards = sorted(p for p in self.out_dir.glob(paths.WORKER_SHARDS) if (p / paths.RESULTS).is_file())
        return merge(shards, self.out_dir) if shards else []

    def publish(self, stream: TextIO | None = None, page: bool = True) -> None:
        """Terminal table, summary.md, report.html and the step summary of what ran (nothing from a worker, nor
        when nothing ran)."""
        if self.worker:
            return
        results = self.collected()
        if not results:
            return
        from parity.reports.publish import publish

        publish(self.out_dir, results, self.elapsed(), stream=stream, page=page, early=self._early,
                history=self.options.history)

    def elapsed(self) -> float:
        return time.perf_counter() - self._started

    def abandon_figures(self) -> None:
        """Stop the background figure worker: there is no page to draw for."""
        if self._early is not None:
            self._early.figures([])

    def close(self) -> None:
        """Stop the warm forkserver (a later run starts a new one)."""
        if self._runner is not None:
            self._runner.close()
