""".ci/run's own shell plumbing (what CI runs on a clean clone), and ci/nightly.sh's check that a lane ran rows and
ran none without its golden."""

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


def _rows_check() -> str:
    """The check ci/nightly.sh runs after a lane (its `python - "$out" "$lane" <<'PY'` block), as written there."""
    text = (REPO / "ci" / "nightly.sh").read_text()
    start = text.index("\n", text.index("<<'PY'")) + 1
    return text[start:text.index("\nPY\n", start)]


GOLDEN = "no golden: golden reference $PARITY_GOLDEN_DIR/x is not recorded (...)"
NOT_RUN = "no golden: {n} rows of lane a2b3-8 not run; record with .github/workflows/goldens.yml and pin"


@pytest.mark.parametrize(("skips", "failures", "ran", "rc", "no_golden"), [
    ([GOLDEN] * 2, [], 0, 3, 2),  # a lane awaiting goldens (not required): not green, and says so
    ([], [f"ERROR x\n  required to run here (--require f) but it would SKIP: {GOLDEN}"], 1, 3, 1),  # required
    ([GOLDEN], [], 3, 3, 1),  # one row without its golden among rows that ran
    (["device npu: torch_npu is not installed"] * 2, [], 0, 1, 0),  # the image lacks what the rows need
    (["golden reference g was renamed", "model path $QWEN3_8B_PATH: not set"], [], 0, 1, 0),
    (["device npu: torch_npu is not installed"], [], 1, 0, 0),  # the clean twin: a row ran, none awaits a golden
    ([], [], 2, 0, 0),
])
def test_a_lane_with_a_missing_golden_is_not_green_and_says_so(tmp_path, skips, failures, ran, rc, no_golden):
    cases = "".join(f'<testcase name="s{i}"><skipped message="{m}"/></testcase>' for i, m in enumerate(skips))
    cases += "".join(f'<testcase name="f{i}"><failure message="{m}">{m}</failure></testcase>'
                     for i, m in enumerate(failures))
    cases += "".join(f'<testcase name="r{i}"/>' for i in range(ran))
    total = len(skips) + len(failures) + ran
    (tmp_path / "junit.xml").write_text(f'<testsuites><testsuite tests="{total}" skipped="{len(skips)}" '
                                        f'failures="{len(failures)}">{cases}</testsuite></testsuites>')
    done = subprocess.run([sys.executable, "-", str(tmp_path), "a2b3-8"], input=_rows_check(), text=True,
                          capture_output=True, check=False)
    assert done.returncode == rc, done.stdout + done.stderr
    said = NOT_RUN.format(n=no_golden).replace("1 rows", "1 row")
    assert (said in done.stdout.splitlines()[-1]) is bool(no_golden), done.stdout
