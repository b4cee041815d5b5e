"""Shared fixtures: one on-disk cache (tiny checkpoints, references) per test session, and helpers that
write scenario files and run the CLI in a subprocess."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from parity.harness.config.matrix import load_file
from parity.harness.contract.schema import Scenario
from parity.harness.options import RunOptions

if TYPE_CHECKING:  # the runner and the judge import torch, which the Python 3.10 lane (torch-free tests) lacks
    from parity.harness.judge.verdict import Verdict
    from parity.harness.runner import Runner

# the report pages (matplotlib) are imported before any nested session: pytester's in-process runs unload every
# module they imported first, and a matplotlib imported again next to parts of the old one breaks both
import parity.reports.publish  # noqa: F401  isort: skip

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


MULTIPROC = Path(__file__).parent / "multiproc"
TORCH = importlib.util.find_spec("torch") is not None
TORCH_FREE = "pytestmark = pytest.mark.torch_free"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without torch (the Python 3.10 lane, ci/py310.sh) only the test modules that declare themselves torch-free
    (TORCH_FREE) are collected: importing any other needs torch."""
    if TORCH or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return TORCH_FREE not in collection_path.read_text()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/multiproc and scenario items launch real ranks: marked, so `-m "not multiprocess"`
    runs the pure unit tests. Scenario items run first: a test's clean twin that is one of them (the same run)
    takes its verdict instead of running it again (tests/session_runner.py)."""
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


@pytest.fixture(scope="session")
def runner(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """A Runner shared by the tests that launch real engines (references are computed once). It plans with the
    default matrix, so its forkserver preloads every CPU engine and tiny model once, not per rank."""
    from tests.session_runner import SessionRunner

    return SessionRunner(RunOptions(out_dir=tmp_path_factory.mktemp("parity-out"), cache_dir=cache_dir),
                         load_file(REPO / "scenarios" / "cpu.yaml"))


@pytest.fixture(scope="session")
def verl_runner(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """The verl tests' Runner, planned with the verl rows: its forkserver preloads what the verl lane's scenario
    items already had it preload (verl's import costs a process seconds), so no test restarts it."""
    from tests.session_runner import SessionRunner

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
