"""pytest plugin (entry point `pytest11: parity`): scenario YAML files become test items.

`pytest -m nightly` collects `scenarios/*.yaml` (ini `parity_scenario_dirs`), one item per scenario id,
with the scenario's marks as pytest markers; `-k` works on ids. Each item runs through the same Runner as
`parity run` (harness/session.py); the parity table is printed and written when the session ends; metrics go into
JUnit XML properties. This module is wiring only: running, judging and rendering live elsewhere.
"""

from __future__ import annotations

import fnmatch
import io
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from parity.harness.config.selection import with_device
from parity.harness.config.shard import Shard, split
from parity.harness.config.validate import broken_here, check_environment, check_scenario, skip_reason
from parity.harness.contract.schema import Scenario
from parity.harness.options import add_options, run_options
from parity.harness.run.launch import expect_preload
from parity.harness.run.preload import forkserver_preload
from parity.harness.session import Interrupted, Session, junit_properties

if TYPE_CHECKING:  # the judge imports torch: only a session that runs a scenario pays for it
    from parity.harness.judge.verdict import Verdict

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

SESSION = pytest.StashKey[Session]()
"""The pytest session's parity Session (config.stash)."""


def _session(config: pytest.Config) -> Session:
    """The session's parity Session. Under pytest-xdist each worker writes its own shard (OUT/gw0, ...) and the
    controller, which runs no item, merges them when it publishes."""
    try:
        options = run_options(lambda name: config.getoption(f"parity_{name}"))
    except ScenarioError as exc:
        raise pytest.UsageError(str(exc).replace("--", "--parity-")) from None
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    controller = not worker and config.getoption("dist", default="no") != "no"
    return Session(options, worker=worker, controller=controller, out_option="--parity-out")


def _run(config: pytest.Config, scenario: Scenario) -> Verdict:
    session = config.stash[SESSION]
    try:
        session.open()
    except ScenarioError as exc:  # the out dir, checked before the first scenario runs
        pytest.exit(f"parity: error: {exc}", returncode=2)
    try:
        return session.run(scenario)
    except Interrupted as exc:  # recorded as ERROR: report what finished, stop
        _stop(config, exc)
        raise


def _stop(config: pytest.Config, exc: Interrupted) -> None:
    """SIGTERM / SIGINT, as `parity run` handles them: the warm forkserver stopped, results.jsonl and summary.md
    written for what finished, pytest ends with exit code 128 + signal."""
    config.stash[SESSION].close()
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        _publish(config, terminal)
    pytest.exit(f"parity: {exc}", returncode=128 + exc.signum)


def _publish(config: pytest.Config, terminal: Any) -> None:
    """Print and write the table (under xdist only the controller does, over every worker's shard)."""
    buffer = io.StringIO()
    config.stash[SESSION].publish(stream=buffer)
    if buffer.getvalue():
        terminal.write_sep("=", "parity summary")
        terminal.write(buffer.getvalue())



def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "backend-parity scenarios")
    add_options(group.addoption, "parity-")
    parser.addini("parity_scenario_dirs", "more directories whose *.yaml files are scenario files (besides any "
                  "directory named scenarios)", type="paths",
                  default=[])


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    session = _session(config)
    config.stash[SESSION] = session
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


def _start_forkserver_for_files(config: pytest.Config, session: Session) -> None:
    """Start the forkserver before collection, for every row of the session's scenario files: collecting the test
    modules keeps one core busy while the other idles, and the server's imports (torch, transformers, megatron) fit
    there. At collection finish the selected rows ask for a subset of that preload, which the running server
    serves (launch's reuse rule); a selection it cannot serve (the server holds what a selected engine must patch
    first) restarts it with the right preload, as any launch would. Bad files are left to collection, which names
    them."""
    try:
        scenarios = with_device([s for f in _scenario_files(config) for s in load_file(f)],
                                config.getoption("parity_device"))
    except (ScenarioError, OSError):
        return
    session.start_forkserver(scenarios)


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
            session.planned.append(scenario)
            item = ScenarioItem.from_parent(self, name=scenario.id, scenario=scenario)
            for mark in scenario.marks:
                item.add_marker(mark)
            if broken_here(scenario):
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
        if (reason := skip_reason(self.scenario)) is None:
            check_environment(self.scenario)
        verdict = _run(self.config, self.scenario)
        self.user_properties += junit_properties(verdict)
        if verdict.status == "SKIP":
            pytest.skip(reason or "; ".join(verdict.reasons))
        if verdict.status != "PASS":
            raise ParityFailure(verdict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ParityFailure):
            verdict = excinfo.value.verdict
            from parity.reports.triage import log_lines

            lines = [f"{verdict.status} {verdict.id}", *(f"  {r}" for r in verdict.reasons)]
            if log := log_lines(verdict.to_json()):  # the first-dying rank's log: its path, its tail
                lines += [f"  {log[0]}", *(f"    {line}" for line in log[1:])]
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
    parity.planned[:] = [item.scenario for item in session.items if isinstance(item, ScenarioItem)]
    if parity.planned:  # the session's first forkserver (maybe a test's) preloads for the items too
        expect_preload(forkserver_preload(parity.planned)[0])
        if not session.config.option.collectonly:
            parity.start_forkserver()  # importing while pytest starts the first items


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Any:
    """SIGTERM / SIGINT while a scenario runs stop the session (Session.signals; _run records the scenario ERROR
    and stops pytest with 128 + signal); SIGTERM between items stops the same way, SIGINT there is pytest's
    KeyboardInterrupt."""
    config = session.config

    def between_items(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        _stop(config, Interrupted(signum))

    with config.stash[SESSION].signals(idle=between_items):
        return (yield)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    _publish(config, terminalreporter)
