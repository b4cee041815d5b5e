""".ci/run's own shell plumbing (what CI runs on a clean clone), and ci/nightly.sh's check that a lane ran rows."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


def _all_skipped_check() -> str:
    """The check ci/nightly.sh runs after a lane (its `python - "$out" <<'PY'` block), as written there."""
    text = (REPO / "ci" / "nightly.sh").read_text()
    start = text.index("\n", text.index("<<'PY'")) + 1
    return text[start:text.index("\nPY\n", start)]


@pytest.mark.parametrize(("skips", "ran", "ok"), [
    (["golden reference $PARITY_GOLDEN_DIR/x is not recorded (...)"] * 2, 0, True),  # a lane awaiting goldens
    (["device npu: torch_npu is not installed"] * 2, 0, False),  # the image lacks what the rows need
    (["golden reference g is not recorded", "model path $QWEN3_8B_PATH: not set"], 0, False),
    (["device npu: torch_npu is not installed"], 1, True),
])
def test_a_lane_that_only_awaits_goldens_is_not_a_lane_that_ran_nothing(tmp_path, skips, ran, ok):
    cases = "".join(f'<testcase name="s{i}"><skipped message="{m}"/></testcase>' for i, m in enumerate(skips))
    cases += "".join(f'<testcase name="r{i}"/>' for i in range(ran))
    (tmp_path / "junit.xml").write_text(f'<testsuites><testsuite tests="{len(skips) + ran}" skipped="{len(skips)}">'
                                        f"{cases}</testsuite></testsuites>")
    done = subprocess.run([sys.executable, "-", str(tmp_path)], input=_all_skipped_check(), text=True,
                          capture_output=True, check=False)
    assert (done.returncode == 0) is ok, done.stdout + done.stderr
    assert ("awaits a golden" in done.stdout) is (ok and not ran)
