"""pytest plugin (entry point `pytest11: parity`): scenario YAML files become test items.

`pytest -m nightly` collects `scenarios/*.yaml` (ini `parity_scenario_dirs`), one item per scenario id,
with the scenario's marks as pytest markers; `-k` works on ids. Each item runs through the same Runner as
`parity run`; the parity table is printed and written when the session ends; metrics go into JUnit XML
properties. This module is wiring only: running, judging and rendering live elsewhere.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from parity.harness.config.selection import with_device
from parity.harness.config.shard import Shard, split
from parity.harness.config.validate import check_environment, check_scenario, skip_reason
from parity.harness.contract.schema import Scenario
from parity.harness.options import add_options, run_options, writable_out_dir
from parity.harness.run.launch import Interrupted, expect_preload, start_forkserver
from parity.harness.run.preload import forkserver_preload

if TYPE_CHECKING:  # the runner and the judge import torch: only a session that runs a scenario pays for it
    from parity.harness.judge.verdict import Verdict
    from parity.harness.runner import Runner
    from parity.reports.early_figures import EarlyFigures

MARKERS = {
    "nightly": "scenario runs in the nightly matrix",
    "pr": "scenario runs on every pull request (CPU)",
    "broken": "scenario is known broken: listed, not run",
    "npu": "needs an Ascend NPU",
    "cuda": "needs a CUDA GPU",
    "golden": "a GPU golden the nightly is judged against (scenarios/goldens.yaml, recorded by goldens.yml)",
    "smoke": "tiny-model device scenarios that gate the big nightly lanes",
    "strict": "fp32 scenarios on the device judged on the strict fp32 limits",
    "cards16": "needs a 16-card node (verl's linux-aarch64-a3-16 runner set)",
    "emulated_npu": "the real MindSpeed source under the emulated torch_npu (needs PARITY_MINDSPEED_SRC)",
}
JUNIT_METRICS = ("logprob_max_abs", "logprob_mean_abs", "loss_rel_max", "grad_norm_rel_max", "step_time_s",
                 "peak_memory_mb")


class ParitySession:
    """Per-pytest-session state: the Runner (built on first use, knowing every collected scenario) and results."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.running = False
        """A scenario's ranks are running (a signal must go through its launcher's cleanup)."""
        try:
            options = run_options(lambda name: config.getoption(f"parity_{name}"))
        except ScenarioError as exc:
            raise pytest.UsageError(str(exc).replace("--", "--parity-")) from None
        self.out_dir = options.out_dir
        # pytest-xdist: each worker writes its own shard (OUT/gw0, ...); the controller merges them at the end
        self.worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.options = replace(options, out_dir=options.out_dir / self.worker) if self.worker else options
        self.controller = not self.worker and config.getoption("dist", default="no") != "no"
        """The xdist controller: merges this session's worker shards, and first removes those of earlier runs."""
        if self.controller:
            for stale in self.out_dir.glob("gw*"):
                shutil.rmtree(stale, ignore_errors=True)
        self.scenarios: list[Scenario] = []
        self.results: list[dict[str, Any]] = []
        self._early: EarlyFigures | None = None
        """The report's figures, drawn as results come (not by xdist workers: the controller draws the page)."""
        self._runner: Runner | None = None
        self._started = time.perf_counter()

    def run(self, scenario: Scenario) -> Verdict:
        from parity.harness.judge.verdict import failed

        if self._runner is None:
            from parity.harness.runner import Runner
            from parity.reports import results as results_file

            try:
                writable_out_dir(self.options.out_dir, "--parity-out")
            except ScenarioError as exc:
                pytest.exit(f"parity: error: {exc}", returncode=2)
            results_file.reset(self.options.out_dir)
            self._runner = Runner(self.options, self.scenarios)
        self.running = True
        try:
            verdict = self._runner.run_scenario(scenario)
        except Interrupted as exc:  # the launcher killed the ranks on the way out: record ERROR, report, stop
            self.record(failed(scenario, "running", exc))
            self.stop(exc)
        finally:
            self.running = False
        self.record(verdict)
        return verdict

    def stop(self, exc: Interrupted) -> None:
        """SIGTERM / SIGINT, as `parity run` handles them: the warm forkserver stopped, results.jsonl and
        summary.md written for what finished, pytest ends with exit code 128 + signal."""
        if self._runner is not None:
            self._runner.close()
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            self.publish(terminal)
        pytest.exit(f"parity: {exc}", returncode=128 + exc.signum)

    def record(self, verdict: Verdict) -> None:
        from parity.reports import results as results_file

        result = verdict.to_json()
        results_file.append(self.options.out_dir, result)
        self.results.append(result)
        if not self.worker:
            if self._early is None:
                from parity.reports.early_figures import EarlyFigures

                self._early = EarlyFigures()
            self._early.submit(result)

    def publish(self, terminal: Any) -> None:
        """Print and write the table; under xdist only the controller does, over every worker's shard."""
        import io

        from parity.reports import results as results_file
        from parity.reports.publish import publish

        if self.worker:
            return
        shards = sorted(p for p in self.out_dir.glob("gw*") if (p / results_file.RESULTS).is_file()) \
            if self.controller else []
        merged = self.results or (results_file.load(shards) if shards else [])
        if not merged:
            return
        if shards and not self.results:
            results_file.reset(self.out_dir)
            for result in merged:
                results_file.append(self.out_dir, result)
        buffer = io.StringIO()
        publish(self.out_dir, merged, time.perf_counter() - self._started, stream=buffer, early=self._early,
                history=self.options.history)
        terminal.write_sep("=", "parity summary")
        terminal.write(buffer.getvalue())


SESSION = pytest.StashKey[ParitySession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "backend-parity scenarios")
    add_options(group.addoption, "parity-")
    parser.addini("parity_scenario_dirs", "more directories whose *.yaml files are scenario files (besides any "
                  "directory named scenarios)", type="paths",
                  default=[])


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    session = ParitySession(config)
    config.stash[SESSION] = session
    if not session.worker and config.pluginmanager.hasplugin("dsession"):  # xdist controller: drop old shards
        for shard in session.out_dir.glob("gw*"):
            shutil.rmtree(shard, ignore_errors=True)
    if not config.option.collectonly and not session.controller:  # a controller runs no item
        _start_forkserver_for_files(config, session)


def _scenario_files(config: pytest.Config) -> list[Path]:
    """The scenario files among the session's arguments (testpaths when none), before pytest collects them; the
    walk skips what pytest's does not enter (ini norecursedirs: .venv, .git, build, ...)."""
    skip = config.getini("norecursedirs")
    files: list[Path] = []
    for arg in config.args:
        path = Path(str(arg).split("::")[0])
        found = [path]
        if path.is_dir():
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not any(fnmatch.fnmatch(d, pattern) for pattern in skip))
                found += [Path(root, name) for name in sorted(names)]
        files += [p for p in found if p.suffix in (".yaml", ".yml") and _is_scenario_file(p, config)]
    return list({path.resolve(): path for path in files}.values())  # a file both walked and named: once


def _start_forkserver_for_files(config: pytest.Config, session: ParitySession) -> None:
    """Start the forkserver before collection, for every row of the session's scenario files: collecting the test
    modules keeps one core busy for ~7-15 s while the other idles, and the server's imports (torch, transformers,
    megatron: ~6-13 s of CPU) fit there. At collection finish the selected rows ask for a subset of that preload,
    which the running server serves (launch's reuse rule); a selection it cannot serve (the server holds what a
    selected engine must patch first) restarts it with the right preload, as any launch would. Bad files are left
    to collection, which names them."""
    try:
        scenarios = with_device([s for f in _scenario_files(config) for s in load_file(f)],
                                config.getoption("parity_device"))
    except (ScenarioError, OSError):
        return
    if scenarios and session.options.forks_here(scenarios):
        start_forkserver(*forkserver_preload(scenarios))


def _is_scenario_file(file_path: Path, config: pytest.Config) -> bool:
    """YAML in a directory named `scenarios` (or one listed in ini `parity_scenario_dirs`), or named explicitly."""
    parent = file_path.resolve().parent
    if parent.name == "scenarios" or parent in [Path(d).resolve() for d in config.getini("parity_scenario_dirs")]:
        return True
    return any(Path(str(arg).split("::")[0]).resolve() == file_path.resolve() for arg in config.args)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix in (".yaml", ".yml") and _is_scenario_file(file_path, parent.config):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    def collect(self) -> list[ScenarioItem]:
        try:
            scenarios = with_device(load_file(self.path), self.config.getoption("parity_device"))
            for scenario in scenarios:
                check_scenario(scenario)
        except ScenarioError as exc:
            raise self.CollectError(str(exc)) from None
        session = self.config.stash[SESSION]
        items = []
        for scenario in scenarios:
            session.scenarios.append(scenario)
            item = ScenarioItem.from_parent(self, name=scenario.id, scenario=scenario)
            for mark in scenario.marks:
                item.add_marker(mark)
            if scenario.broken:
                item.add_marker("broken")
            items.append(item)
        return items


class ParityFailure(Exception):
    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        super().__init__(verdict.status)


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario

    def runtest(self) -> None:
        session = self.config.stash[SESSION]
        if (reason := skip_reason(self.scenario)) is None:
            check_environment(self.scenario)
        verdict = session.run(self.scenario)
        for key in JUNIT_METRICS:
            if key in verdict.metrics:
                self.user_properties.append((key, verdict.metrics[key]))
        self.user_properties.append(("verdict", verdict.status))
        if verdict.status == "SKIP":
            pytest.skip(reason or "; ".join(verdict.reasons))
        if verdict.status != "PASS":
            raise ParityFailure(verdict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ParityFailure):
            verdict = excinfo.value.verdict
            lines = [f"{verdict.status} {verdict.id}", *(f"  {r}" for r in verdict.reasons)]
            if tail := verdict.info.get("log_tail"):
                lines += ["  log tail:", *(f"    {line}" for line in tail.splitlines()[-30:])]
            return "\n".join(lines)
        if isinstance(excinfo.value, ScenarioError):
            return f"bad scenario input: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario {self.scenario.id}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--parity-shard I/N: keep this shard's scenario items (other tests are not sharded)."""
    if not (text := config.getoption("parity_shard")):
        return
    try:
        shard = Shard.parse(text)
    except ScenarioError as exc:
        raise pytest.UsageError(str(exc)) from None
    scenarios = [item.scenario for item in items if isinstance(item, ScenarioItem)]
    kept = {scenario.id for scenario in split(scenarios, shard)}
    mine = [not isinstance(item, ScenarioItem) or item.scenario.id in kept for item in items]
    config.hook.pytest_deselected(items=[item for item, keep in zip(items, mine, strict=True) if not keep])
    items[:] = [item for item, keep in zip(items, mine, strict=True) if keep]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The Runner plans with the scenarios this session will run (after -k / -m / --parity-shard), not every
    collected one: a deselected MindSpeed row must not keep megatron out of the forkserver's preload; and the
    launcher expects their preload from the start."""
    parity = session.config.stash[SESSION]
    parity.scenarios[:] = [item.scenario for item in session.items if isinstance(item, ScenarioItem)]
    if parity.scenarios:  # the session's first forkserver (maybe a test's) preloads for the items too
        preload, exclude = forkserver_preload(parity.scenarios)
        expect_preload(preload)
        if parity.options.forks_here(parity.scenarios) and not session.config.option.collectonly:
            start_forkserver(preload, exclude)  # importing while pytest starts the first items


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Any:
    """SIGTERM / SIGINT while a scenario runs become `Interrupted` (its launcher kills the ranks on the way out,
    ParitySession.run records it ERROR and stops pytest with 128 + signal); SIGTERM between items stops the same
    way, SIGINT there is pytest's KeyboardInterrupt."""
    parity = session.config.stash[SESSION]

    def handler(signum: int, _frame: Any) -> None:
        if parity.running:
            raise Interrupted(signum)
        if signum == signal.SIGINT:  # outside a scenario: pytest's own Ctrl-C handling
            raise KeyboardInterrupt
        parity.stop(Interrupted(signum))

    if threading.current_thread() is not threading.main_thread():
        return (yield)
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return (yield)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    config.stash[SESSION].publish(terminalreporter)
