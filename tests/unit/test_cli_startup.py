"""What `parity` does before its first scenario: the CLI module imports neither torch nor matplotlib (`--help`, `list`
and bad input answer without them), and `parity run` starts the forkserver's imports before its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from parity.harness.contract.schema import Scenario
from parity.harness.options import RunOptions
from tests.conftest import REPO

pytestmark = pytest.mark.torch_free

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
import parity.harness.session as session
def start(preload, exclude=()):
    print("torch imported:", "torch" in sys.modules, "| preload:", " ".join(preload), flush=True)
    raise SystemExit(0)
session.start_forkserver = start
cli.main(["run", "scenarios/cpu.yaml", "-k", "tiny-qwen3/fsdp2/dp2/fp32/cpu", "--out", sys.argv[1]])
print("never started", flush=True)
"""


def test_run_starts_the_forkserver_before_it_imports_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", START_PROBE, str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert "torch imported: False" in result.stdout, result.stdout + result.stderr
    assert "parity.engines.fsdp2.engine" in result.stdout.split("| preload:")[1]


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
