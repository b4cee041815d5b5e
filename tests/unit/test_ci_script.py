""".ci/run's own shell plumbing (what CI runs on a clean clone)."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO


def _with_exit_trap(body: str) -> int:
    trap = next(line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("trap "))
    script = f"set -euo pipefail\nwork=$(mktemp -d)\n{trap}\n{body}\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, timeout=30).returncode


def test_the_exit_trap_keeps_a_green_run_green_and_a_red_one_red():
    """set -e applies inside an EXIT trap: `kill $(jobs -p)` with no background job left exits 2, which turned an
    all-green .ci/run (background installs waited for) into exit code 2."""
    assert _with_exit_trap("sleep 0.05 & pid=$!\nwait $pid\necho green") == 0
    assert _with_exit_trap("sleep 0.05 & pid=$!\nwait $pid\nfalse") == 1
    assert _with_exit_trap("sleep 30 &\nexit 3") == 3  # a failed step: the install still running is killed
