"""`parity bisect` on a local clone: megatron-core's own source (the installed package, copied into a fresh git
repository) with a regression committed between two harmless commits (RoPE frequencies 1 % off, in
megatron/core/models/common/embeddings/rotary_pos_embedding.py). The bisection must name that commit, from the
verdicts of the scenario run against each candidate tree; the clean twin (a range without the regression) has no
bad commit to name and says so. Then the nightly's use: a night that flipped PASS -> FAIL while its Megatron tree
moved is bisected by `parity bisect --flipped`, and its report names the first bad commit."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.multiprocess
ROW = "tiny-qwen3/megatron/tp2/fp32/cpu"
ROPE = "megatron/core/models/common/embeddings/rotary_pos_embedding.py"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def megatron_clone(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A git repo of megatron-core's source: base, a README change, the RoPE regression, a comment change."""
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed")
    repo = tmp_path_factory.mktemp("megatron-lm")
    shutil.copytree(Path(next(iter(spec.submodule_search_locations))), repo / "megatron" / "core",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "megatron" / "__init__.py").touch()
    git(repo, "init", "-q")
    commits = {"good": commit(repo, "megatron-core as installed")}
    (repo / "README.md").write_text("a harmless change\n")
    commits["readme"] = commit(repo, "docs: a README")
    rope = repo / ROPE
    text = rope.read_text()
    assert "self.inv_freq = 1.0 / (" in text
    rope.write_text(text.replace("self.inv_freq = 1.0 / (", "self.inv_freq = 1.01 / (", 1))
    commits["regression"] = commit(repo, "rope: fold the scaling into inv_freq")
    rope.write_text(rope.read_text() + "\n# a harmless comment\n")
    commits["bad"] = commit(repo, "style: a comment")
    return repo, commits


def test_bisect_names_the_commit_that_broke_the_scenario(megatron_clone, tmp_path):
    repo, commits = megatron_clone
    done = run_cli("bisect", "scenarios/cpu.yaml", "-k", ROW, "--project", "megatron", "--repo", str(repo),
                   "--good", commits["good"], "--bad", commits["bad"], "--out", str(tmp_path), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    [answer] = json.loads((tmp_path / "bisect.json").read_text())
    assert answer["first_bad"] == commits["regression"], answer
    verdicts = {t["commit"]: t["verdict"] for t in answer["trials"]}
    assert verdicts == {commits["regression"]: "FAIL", commits["readme"]: "PASS"}, verdicts
    assert f"first bad megatron commit for {ROW}: {commits['regression'][:10]}" in done.stdout


def test_bad_input_is_named_with_exit_2(megatron_clone, tmp_path):
    repo, commits = megatron_clone
    done = run_cli("bisect", "scenarios/cpu.yaml", "-k", ROW, "--project", "megatron", "--repo", str(repo),
                   "--good", commits["bad"], "--bad", commits["good"], "--out", str(tmp_path))
    assert done.returncode == 2 and "is not an ancestor" in done.stderr, done.stderr
    done = run_cli("bisect", "scenarios/cpu.yaml", "-k", "tiny-qwen3", "--project", "megatron", "--repo", str(repo),
                   "--good", commits["good"], "--bad", commits["bad"], "--out", str(tmp_path))
    assert done.returncode == 2 and "bisect needs one" in done.stderr, done.stderr
