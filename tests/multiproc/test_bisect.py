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

from parity.reports import results as results_file
from tests.conftest import run_cli

pytestmark = pytest.mark.multiprocess
ROW = "tiny-qwen3/megatron/single/fp32/cpu"
"""One rank: each trial is a fresh `parity run` (its own interpreter, forkserver and Megatron import)."""
ROPE = "megatron/core/models/common/embeddings/rotary_pos_embedding.py"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def planted_history(package: str, repo: Path, where: str, path: str, old: str, new: str,
                    subject: str) -> dict[str, str]:
    """A git repository at `repo` of an installed package's source (copied to `where` under it): the source as
    installed (good), a README (harmless), the regression (every `old` -> `new` in `path`, committed as `subject`),
    a comment (harmless, bad). Skips where the package is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    shutil.copytree(Path(next(iter(spec.submodule_search_locations))), repo / where,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for parent in Path(where).parents[:-1]:  # a namespace's parent package (megatron/ of megatron/core)
        (repo / parent / "__init__.py").touch()
    git(repo, "init", "-q")
    commits = {"good": commit(repo, f"{package} as installed")}
    (repo / "README.md").write_text("a harmless change\n")
    commits["readme"] = commit(repo, "docs: a README")
    planted = repo / path
    text = planted.read_text()
    assert old in text, f"{path} no longer holds {old!r}: update the planted regression"
    planted.write_text(text.replace(old, new))
    commits["regression"] = commit(repo, subject)
    planted.write_text(planted.read_text() + "\n# a harmless comment\n")
    commits["bad"] = commit(repo, "style: a comment")
    return commits


@pytest.fixture(scope="module")
def megatron_clone(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A git repo of megatron-core's source: base, a README change, the RoPE regression, a comment change."""
    repo = tmp_path_factory.mktemp("megatron-lm")
    return repo, planted_history("megatron.core", repo, "megatron/core", ROPE, "self.inv_freq = 1.0 / (",
                                 "self.inv_freq = 1.01 / (", "rope: fold the scaling into inv_freq")


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scenarios") / "bisect.yaml"
    path.write_text("matrix:\n  - {model: tiny-qwen3, strategy: megatron, device: cpu, timeout: 300}\n")
    return path


def _night(directory: Path, verdict: str, tree: Path, commit: str, started: str, source: Path) -> None:
    """A night's results.jsonl with the row as a run against the Megatron-LM tree at `commit` records it."""
    provenance = {"harness_commit": "abc1234", "started": started, "versions": {"megatron-core": "0.16.1"},
                  "megatron_lm": {"tree": str(tree), "commit": commit}}
    results_file.append(directory, {"id": ROW, "verdict": verdict, "source": str(source),
                                    "reasons": [] if verdict == "PASS" else ["log-prob before training max |Δ|"],
                                    "provenance": provenance})


@pytest.mark.nightly  # end to end in the nightly CPU lane, beside the bisect step it tests (ci/nightly.sh)
def test_a_flipped_row_is_bisected_to_the_commit_that_broke_it_and_the_report_names_it(megatron_clone, tmp_path,
                                                                                         cache_dir, scenario_file):
    """The nightly's use (ci/nightly.sh): the row PASSed last night at `good` and FAILs tonight at `bad`; the
    bisection runs the scenario against the commits between (the regression: FAIL, the README commit: PASS) and
    names the regression in tonight's report."""
    repo, commits = megatron_clone
    _night(tmp_path / "prev", "PASS", repo, commits["good"], "2026-12-02T02:00:00+00:00", scenario_file)
    _night(tmp_path / "now", "FAIL", repo, commits["bad"], "2026-12-03T02:00:00+00:00", scenario_file)
    done = run_cli("bisect", "--flipped", str(tmp_path / "now"), "--history", str(tmp_path / "prev"), "--cache-dir",
                   str(cache_dir), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    [answer] = json.loads((tmp_path / "now" / "bisect.json").read_text())
    assert answer["first_bad"] == commits["regression"], answer
    verdicts = {t["commit"]: t["verdict"] for t in answer["trials"]}
    assert verdicts == {commits["regression"]: "FAIL", commits["readme"]: "PASS"}, verdicts
    line = f"first bad megatron-lm commit for {ROW}: {commits['regression'][:10]} rope: fold the scaling into inv_freq"
    assert line in done.stdout
    for page in ("summary.md", "report.html"):
        assert line in (tmp_path / "now" / page).read_text(), page


def test_bad_input_is_named_with_exit_2(megatron_clone, tmp_path, scenario_file):
    repo, commits = megatron_clone
    done = run_cli("bisect", str(scenario_file), "-k", ROW, "--project", "megatron-lm", "--repo", str(repo),
                   "--good", commits["bad"], "--bad", commits["good"], "--out", str(tmp_path))
    assert done.returncode == 2 and "is not an ancestor" in done.stderr, done.stderr
    done = run_cli("bisect", "scenarios/cpu.yaml", "-k", "tiny-qwen3", "--project", "megatron-lm", "--repo", str(repo),
                   "--good", commits["good"], "--bad", commits["bad"], "--out", str(tmp_path))
    assert done.returncode == 2 and "bisect needs one" in done.stderr, done.stderr


@pytest.mark.nightly  # two nights and a bisection, each a fresh `parity run`: minutes on 2 cores
def test_a_real_failing_night_names_its_cause_on_the_first_screen(megatron_clone, tmp_path, cache_dir, scenario_file):
    """Issue 35's "done when" on real nights, not written results: last night the row ran against the Megatron-LM
    tree at `good` and PASSed, tonight at `bad` (the RoPE regression two commits back) it FAILs; tonight's run reads
    last night's out dir (--history), `parity bisect --flipped` finds the regression, and report.html's first
    screen in headless Chromium names the failing row, its first divergent step and module, the Megatron-LM
    commit that changed since the previous night, and the first bad commit."""
    from parity.harness.bisect import PROJECTS, environment
    from tests.browser import CHROMIUM, first_screen

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    repo, commits = megatron_clone
    for night, commit_id in (("prev", commits["good"]), ("now", commits["bad"])):
        tree = tmp_path / f"tree-{night}"
        git(repo, "worktree", "add", "-q", "--detach", str(tree), commit_id)
        history = ["--history", str(tmp_path / "prev")] if night == "now" else []
        done = run_cli("run", str(scenario_file), "--out", str(tmp_path / night), "--cache-dir", str(cache_dir),
                       *history, env=environment(PROJECTS["megatron-lm"], tree), timeout=900)
        assert done.returncode == (1 if night == "now" else 0), done.stdout + done.stderr
    done = run_cli("bisect", "--flipped", str(tmp_path / "now"), "--history", str(tmp_path / "prev"), "--cache-dir",
                   str(cache_dir), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    screen = first_screen((tmp_path / "now" / "report.html").read_text(), tmp_path)
    assert ROW in screen, screen
    assert "first divergent module:" in screen and "step 1" in screen, screen
    assert f"{commits['good'][:10]}" in screen and f"{commits['bad'][:10]}" in screen, screen  # what changed
    assert f"first bad megatron-lm commit for {ROW}: {commits['regression'][:10]}" in screen, screen
