"""The nightly's dress rehearsal (ci/rehearse.py) runs green on this tree, and each blocker the first night would
have hit, planted back into a copy of the tree, turns it red naming the job and step where the night would stop.

Needs the upstream trees the nightly clones (its `prepare` job checks the images against verl's Dockerfiles and
vllm-ascend's requirements): PARITY_VERL_SRC and PARITY_VLLM_ASCEND_SRC (the nightly's cpu job clones both); without
them every test here SKIPs, naming them. Marked nightly: each rehearsal builds a wheelhouse and runs device jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.nightly, pytest.mark.multiprocess]

ROOT = Path(__file__).resolve().parents[2]
TREES = ("PARITY_VERL_SRC", "PARITY_VLLM_ASCEND_SRC")

#: name -> (file, the fixed text, the blocker planted back, the jobs to rehearse, the step that must fail, a line
#: of the failure that says why)
BLOCKERS = {
    # a fresh CPython has no packaging: the wheelhouse needs only the standard library and pip
    "wheelhouse imports packaging": (
        "ci/wheelhouse.sh", "import re\nimport tomllib\n", "import re\nimport tomllib\nimport packaging\n",
        "prepare", "Wheelhouse for the images", "No module named 'packaging'"),
    # HCCL reduces no float64: the emulated group refuses what the device would
    "a float64 all-reduce in fsdp2": (
        "engines/fsdp2/tensor_parallel.py",
        "    dist.all_gather(parts, values.contiguous(), group=group)\n    return torch.stack(parts).sum(dim=0)\n",
        "    values = values.contiguous()\n    dist.all_reduce(values, group=group)\n    return values\n",
        "prepare,smoke", "Tiny-model smoke scenarios", "float64"),
    # the default image of a stack that verl no longer builds: refused before a runner pulls it
    "a stale default image": (
        ".github/workflows/nightly.yml", "verl:verl-8.5.0-910b-ubuntu22.04-py3.11-v0.7.1' }}",
        "verl:verl-8.5.0-910b-ubuntu22.04-py3.11-latest' }}",
        "prepare", "The images against verl's Dockerfiles", "REFUSED"),
    # python -m put the checkout's parity/ ahead of the installed harness
    "the checkout shadows the installed harness": (
        "ci/nightly.sh", 'env "${env[@]}" python -P -m pytest', 'env "${env[@]}" python -m pytest',
        "prepare,smoke", "Tiny-model smoke scenarios", "No module named 'parity.harness'"),
    # a venv seeded with setuptools 65 shadows the image's, which torch requires newer
    "the lane's venv seeds its own setuptools": (
        "ci/nightly.sh", "--system-site-packages --without-pip", "--system-site-packages",
        "prepare,smoke", "Tiny-model smoke scenarios", "setuptools"),
}


def _trees() -> dict[str, str]:
    missing = [name for name in TREES if not os.environ.get(name)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not set: the rehearsal's prepare job checks the images against "
                    "local trees of verl and vllm-ascend (the nightly's cpu job clones both)")
    return {name: os.environ[name] for name in TREES}


def rehearse(tree: Path, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **_trees()}
    return subprocess.run([sys.executable, str(tree / "ci" / "rehearse.py"), "--repo", str(tree), "--work",
                           str(work), *args], capture_output=True, text=True, env=env, timeout=3000, check=False)


def planted_copy(tmp_path: Path, file: str, fixed: str, planted: str) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", "parity-out", "__pycache__",
                                                              ".parity-cache"))
    path = tree / file
    text = path.read_text()
    assert text.count(fixed) == 1, f"{file} no longer holds the fixed text once: update the planted blocker"
    path.write_text(text.replace(fixed, planted))
    return tree


def test_the_rehearsal_runs_green_and_publishes_the_report(tmp_path):
    _trees()
    done = rehearse(ROOT, tmp_path / "work")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "rehearsal green" in done.stdout
    assert (tmp_path / "work" / "pages" / "report.html").is_file()


@pytest.mark.parametrize("name", sorted(BLOCKERS))
def test_a_planted_blocker_turns_the_rehearsal_red_naming_the_step(tmp_path, name):
    _trees()
    file, fixed, planted, jobs, step, why = BLOCKERS[name]
    tree = planted_copy(tmp_path, file, fixed, planted)
    done = rehearse(tree, tmp_path / "work", "--no-goldens", "--jobs", jobs)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED: job")]
    assert done.returncode == 1, done.stdout[-4000:]
    assert any(f'step "{step}' in line for line in failed), failed
    assert why in done.stdout, done.stdout[-4000:]


def test_one_stacks_smoke_failure_leaves_the_other_stacks_lanes_running(tmp_path):
    """A smoke failure on core012 alone: current's strict lane runs (and passes), core012's stops at its gate."""
    _trees()
    fixed = "      - name: Tiny-model smoke scenarios"
    tree = planted_copy(tmp_path, ".github/workflows/nightly.yml", fixed,
                        '      - name: A core012-only failure\n        run: test "${{ matrix.stack }}" != core012\n'
                        + fixed)
    done = rehearse(tree, tmp_path / "work", "--no-goldens", "--jobs", "prepare,smoke,strict")
    lines = done.stdout.splitlines()
    assert any(line.startswith("ok   strict (current") for line in lines), done.stdout[-4000:]
    assert any(line.startswith("FAIL strict (core012") for line in lines), done.stdout[-4000:]
    assert "smoke (core012) did not pass" in done.stdout


#: a night's repository variables -> (the rehearsal's arguments, the job that must fail, a line that says why)
NIGHTS = {
    # an unset variable reads as "": the row names the variable (Path("") was the working directory)
    "an unset model path": (("--var", "QWEN3_0_6B_PATH="), "ascend (a2b3-8", "QWEN3_0_6B_PATH is empty"),
    # no golden recorded or pinned: the big lane is red and says "no golden" first
    "no golden pinned": ((), "ascend (a3-16", "no golden: 1 row of lane a3-16 not run"),
}


@pytest.mark.parametrize("name", sorted(NIGHTS))
def test_a_night_without_what_it_needs_is_red_and_says_why(tmp_path, name):
    _trees()
    args, job, why = NIGHTS[name]
    done = rehearse(ROOT, tmp_path / "work", "--no-goldens", "--jobs", "prepare,smoke,goldens,ascend", *args)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED: job")]
    assert done.returncode == 1, done.stdout[-4000:]
    assert any(line.startswith(f"FAILED: job {job}") for line in failed), failed
    assert why in done.stdout, done.stdout[-4000:]
