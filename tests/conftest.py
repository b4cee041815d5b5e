"""Shared fixtures: one on-disk cache (tiny checkpoints, references) per test session, and helpers that
write scenario files and run the CLI in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from parity.harness.config.matrix import load_file
from parity.harness.contract.schema import Scenario
from parity.harness.judge.verdict import Verdict
from parity.harness.runner import Runner, RunOptions

# the report pages (matplotlib) are imported before any nested session: pytester's in-process runs unload every
# module they imported first, and a matplotlib imported again next to parts of the old one breaks both
import parity.reports.publish  # noqa: F401  isort: skip

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


MULTIPROC = Path(__file__).parent / "multiproc"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/multiproc and scenario items launch real ranks: marked, so `-m "not multiprocess"`
    runs the pure unit tests. Scenario items run first: a test's clean twin that is one of them (the same run)
    takes its verdict instead of running it again (SessionRunner)."""
    for item in items:
        if MULTIPROC in Path(str(item.path)).parents or type(item).__name__ == "ScenarioItem":
            item.add_marker("multiprocess")
    items.sort(key=lambda item: type(item).__name__ != "ScenarioItem")  # stable: each group keeps its order


def _run_key(scenario: Scenario) -> str:
    """What makes two scenarios the same run and the same judgement (marks, source and timeout do not)."""
    return scenario.model_dump_json(exclude={"marks", "source", "timeout"})


#: verdicts of this session's scenario items (the plugin's runs), by _run_key, with their record directories
ITEM_RUNS: dict[str, tuple[Verdict, Path]] = {}


@pytest.hookimpl(trylast=True)  # after the parity plugin has set up its session
def pytest_configure(config: pytest.Config) -> None:
    from parity.harness.config.paths import record_dir
    from parity.harness.pytest_plugin import SESSION

    if SESSION not in config.stash:  # `-p no:parity` (the emulated op cases' own process)
        return
    session = config.stash[SESSION]
    run = session.run

    def run_and_keep(scenario: Scenario) -> Verdict:
        verdict = run(scenario)
        ITEM_RUNS[_run_key(scenario)] = (verdict, record_dir(session.options.out_dir, scenario.id))
        return verdict

    session.run = run_and_keep


@pytest.fixture(scope="session")
def cache_dir(pytestconfig: pytest.Config) -> Path:
    """The session's --parity-cache-dir (default .parity-cache/): tests and scenario items share one set of tiny
    checkpoints and references (the cache key hashes the code that computes a reference, so reuse is safe)."""
    from parity.harness.pytest_plugin import SESSION

    return pytestconfig.stash[SESSION].options.cache_dir.resolve()


class SessionRunner(Runner):
    """The Runner the tests share. A scenario identical field for field to one run earlier in the session returns
    that run's verdict (its record stays under out_dir): a clean twin several tests judge runs once. One that a
    scenario item of this session already ran to a verdict (PASS or FAIL: it finished, so its timeout did not
    matter) takes that verdict, and its record is copied under out_dir as if it had run here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: dict[str, Verdict] = {}

    def run_scenario(self, scenario: Scenario) -> Verdict:
        key = scenario.model_dump_json(exclude={"marks", "source"})
        if key not in self._verdicts:
            self._verdicts[key] = self._from_items(scenario) or super().run_scenario(scenario)
        return self._verdicts[key]

    def _from_items(self, scenario: Scenario) -> Verdict | None:
        verdict, records = ITEM_RUNS.get(_run_key(scenario), (None, None))
        if verdict is None or verdict.status not in ("PASS", "FAIL") or not records.is_dir():
            return None
        shutil.copytree(records, self._record_dir(scenario), dirs_exist_ok=True)
        return verdict


@pytest.fixture(scope="session")
def runner(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """A Runner shared by the tests that launch real engines (references are computed once). It plans with the
    default matrix, so its forkserver preloads every CPU engine and tiny model once, not per rank."""
    return SessionRunner(RunOptions(out_dir=tmp_path_factory.mktemp("parity-out"), cache_dir=cache_dir),
                         load_file(REPO / "scenarios" / "cpu.yaml"))


@pytest.fixture(scope="session")
def verl_runner(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """The verl tests' Runner, planned with the verl rows: its forkserver preloads what the verl lane's scenario
    items already had it preload (verl's import costs a process seconds), so no test restarts it."""
    return SessionRunner(RunOptions(out_dir=tmp_path_factory.mktemp("verl-out"), cache_dir=cache_dir),
                         [*load_file(REPO / "scenarios" / "verl.yaml"),
                          *load_file(REPO / "scenarios" / "verl_megatron.yaml")])


@pytest.fixture
def write_yaml(tmp_path: Path):
    def write(text: str, name: str = "scenarios.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def run_cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`parity ...` in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "parity.harness.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
