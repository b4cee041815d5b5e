"""What `parity` does before its first scenario: the CLI module imports neither torch nor matplotlib (`--help`, `list`
and bad input answer without them), and `parity run` starts the forkserver's imports before its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from parity.harness.contract.schema import Scenario
from parity.harness.options import RunOptions
from tests.conftest import REPO

HEAVY = ("torch", "matplotlib")
PROBE = """
import json, sys
from parity.harness.cli import main
heavy = lambda: [m for m in HEAVY if m in sys.modules]
assert main(["list", "no-such-file.yaml"]) == 2
after_bad_input = heavy()
import parity.reports.html  # the report pages: matplotlib, which the probe must see
print(json.dumps([after_bad_input, heavy()]))
"""


def test_the_cli_and_its_bad_input_import_neither_torch_nor_matplotlib():
    result = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}"], capture_output=True, text=True,
                            timeout=120, cwd=REPO, check=True)
    after_bad_input, after_the_pages = json.loads(result.stdout.strip().splitlines()[-1])
    assert after_bad_input == [] and after_the_pages == ["matplotlib"]


START_PROBE = """
import sys
import parity.harness.cli as cli
def start(preload, exclude=()):
    print("torch imported:", "torch" in sys.modules, "| preload:", " ".join(preload), flush=True)
    raise SystemExit(0)
cli.start_forkserver = start
cli.main(["run", "scenarios/cpu.yaml", "-k", "tiny-qwen3/fsdp2/dp2/fp32/cpu", "--out", sys.argv[1]])
print("never started", flush=True)
"""


def test_run_starts_the_forkserver_before_it_imports_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", START_PROBE, str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert "torch imported: False" in result.stdout, result.stdout + result.stderr
    assert "parity.engines.fsdp2" in result.stdout.split("| preload:")[1]


FORKED = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2})


@pytest.mark.parametrize(("options", "scenarios", "starts"), [
    (RunOptions(), [FORKED], True),
    (RunOptions(launcher="torchrun"), [FORKED], False),
    (RunOptions(node_rank=0, master_port=29500), [FORKED], False),
    (RunOptions(), [FORKED.model_copy(update={"layout": FORKED.layout.model_copy(update={"nodes": 2})})], False),
    (RunOptions(), [FORKED.model_copy(update={"device": "npu"})], False),  # skipped here: nothing to fork
])
def test_a_forkserver_is_started_early_only_where_a_planned_run_is_forked_here(options, scenarios, starts):
    assert options.forks_here(scenarios) is starts


CONFTEST_PROBE = """
import os, signal
from multiprocessing import forkserver
# what the parity plugin started before pytest imported this (initial) conftest
pid = forkserver._forkserver._forkserver_pid
with open(os.environ["PROBE_OUT"], "w") as out:
    out.write(str(pid is not None))
if pid is not None:
    os.kill(pid, signal.SIGKILL)  # its imports (torch, transformers: ~4 s of CPU) would outlive the probe
os._exit(0)  # the answer is in: no collection, no run
"""


@pytest.mark.parametrize(("extra", "started"), [((), True), (("--collect-only",), False)])
def test_pytest_starts_the_forkserver_before_it_imports_the_initial_conftests(tmp_path, extra, started):
    """The pytest analogue of the test above: a conftest that imports torch (tests/conftest.py does) must run next
    to the server's imports. --collect-only runs nothing and starts none."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "s.yaml").write_text("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, "
                                                   "layout: {dp: 2}}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(CONFTEST_PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests scenarios\n")
    probe = tmp_path / "probe.txt"
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *extra],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PROBE_OUT": str(probe)})
    assert probe.read_text() == str(started), result.stdout + result.stderr
