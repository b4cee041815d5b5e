"""`parity bisect`: the first bad commit of an upstream project (verl, MindSpeed, Megatron-LM) for one scenario.

Given a git source tree of the project and a good and a bad commit, each candidate commit between them is checked
out into a git worktree of its own, and the scenario is run against it in a fresh `parity run` (the harness, its
forkserver and every rank import the project from that tree: `PARITY_VERL_SRC`, or the tree first on PYTHONPATH
for MindSpeed and Megatron-LM, as the emulated lane runs MindSpeed). PASS is good, FAIL is bad, and an ERROR or
SKIP cannot say (git bisect's `skip`): the search goes on around it. The answer names the first bad commit and
every verdict it rests on.

`--flipped RUN_DIR --history PREV_DIR` is the nightly's use: every row of RUN_DIR that PASSed in PREV_DIR, FAILs
now, and ran against a source tree whose commit moved between the two nights is bisected between those commits,
the answers are written to RUN_DIR/bisect.json and RUN_DIR's report is published again with them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from parity.harness.config import paths
from parity.harness.config.errors import ScenarioError

BISECT_FILE = paths.BISECT


@dataclass(frozen=True, slots=True)
class Project:
    name: str
    variable: str | None
    """The harness's own variable naming the tree (None: only PYTHONPATH)."""
    on_path: bool
    """The tree goes first on PYTHONPATH (its top-level package sits at the tree's root)."""
    package: str
    """The package whose provenance names the tree's commit in a row (`--flipped`)."""


PROJECTS = {"verl": Project("verl", "PARITY_VERL_SRC", False, "verl"),
            "mindspeed": Project("mindspeed", "PARITY_MINDSPEED_SRC", True, "mindspeed"),
            "megatron-lm": Project("megatron-lm", None, True, "megatron_lm")}


@dataclass(frozen=True, slots=True)
class Trial:
    commit: str
    subject: str
    verdict: str
    reason: str = ""


@dataclass(slots=True)
class Bisection:
    scenario: str
    project: str
    repo: str
    good: str
    bad: str
    first_bad: str | None = None
    subject: str = ""
    candidates: list[str] = field(default_factory=list)
    """When commits that could not be judged (ERROR / SKIP) leave it open: the first bad is one of these."""
    trials: list[Trial] = field(default_factory=list)

    def line(self) -> str:
        runs = f"{len(self.trials)} run(s): " + ", ".join(f"{t.commit[:10]} {t.verdict}" for t in self.trials)
        if self.first_bad:
            return (f"first bad {self.project} commit for {self.scenario}: {self.first_bad[:10]} {self.subject} "
                    f"(between {self.good[:10]} good and {self.bad[:10]} bad; {runs})")
        among = ", ".join(c[:10] for c in self.candidates)
        return (f"first bad {self.project} commit for {self.scenario}: one of {among} (commits that could not be "
                f"judged hide it; {runs})")

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"line": self.line()}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise ScenarioError(f"--repo {repo}: git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def commits_between(repo: Path, good: str, bad: str) -> list[str]:
    """The commits after `good` up to and including `bad`, oldest first, on the ancestry path (what git bisect
    searches). Bad input (not a repository, an unknown commit, good not an ancestor of bad) is a ScenarioError."""
    good_sha, bad_sha = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}"), \
        _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}")
    ancestor = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good_sha, bad_sha],
                              capture_output=True, timeout=60, check=False)
    if ancestor.returncode != 0:
        raise ScenarioError(f"--repo {repo}: the good commit {good} is not an ancestor of the bad commit {bad}")
    commits = _git(repo, "rev-list", "--reverse", "--ancestry-path", f"{good_sha}..{bad_sha}").split()
    if not commits:
        raise ScenarioError(f"--repo {repo}: no commits between {good} and {bad}")
    return commits


def search(commits: list[str], verdict_of: Callable[[str], str]) -> tuple[int | None, list[int]]:
    """Binary search for the first bad of `commits` (the last one is bad, the one before the first good).
    `verdict_of` returns PASS, FAIL or anything else (cannot say). Returns (index of the first bad, or None when
    commits that cannot say leave it open, with the indices it may be)."""
    good, bad = -1, len(commits) - 1
    unknown: set[int] = set()
    while True:
        open_ = [i for i in range(good + 1, bad) if i not in unknown]
        if not open_:
            break
        mid = open_[len(open_) // 2]
        verdict = verdict_of(commits[mid])
        if verdict == "PASS":
            good = mid
        elif verdict == "FAIL":
            bad = mid
        else:
            unknown.add(mid)
    between = [i for i in range(good + 1, bad) if i in unknown]
    return (bad, []) if not between else (None, [*between, bad])


def environment(project: Project, tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    if project.variable:
        env[project.variable] = str(tree)
    if project.on_path:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_at(project: Project, repo: Path, commit: str, files: list[str], run_id: str, work: Path,
           timeout_s: float, cache_dir: Path) -> Trial:
    """The scenario against `commit`: a worktree of it, one `parity run` of the row there, its verdict."""
    tree = work / f"tree-{commit[:12]}"
    out = work / f"out-{commit[:12]}"
    subject = _git(repo, "log", "-1", "--format=%s", commit)
    _git(repo, "worktree", "add", "--detach", "--force", str(tree), commit)
    try:
        done = subprocess.run([sys.executable, "-m", "parity.harness.cli", "run", *files, "-k", run_id, "--out",
                               str(out), "--cache-dir", str(cache_dir)], env=environment(project, tree),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] \
            if (out / "results.jsonl").is_file() else []
        row = next((r for r in rows if r["id"] == run_id), None)
        if row is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return Trial(commit, subject, "ERROR", f"no result (exit {done.returncode}): {tail[0]}")
        return Trial(commit, subject, row["verdict"], "; ".join(row.get("reasons") or [])[:300])
    except subprocess.TimeoutExpired:
        return Trial(commit, subject, "ERROR", f"timed out after {timeout_s:g} s")
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True,
                       timeout=120, check=False)
        shutil.rmtree(tree, ignore_errors=True)


def bisect(project_name: str, repo: Path, good: str, bad: str, files: list[str], run_id: str,
           timeout_s: float = 1800, cache_dir: Path = paths.CACHE, say: Callable[[str], None] = print) -> Bisection:
    """`cache_dir`: the reference cache the trials share (a reference that does not import the project is computed
    once)."""
    if project_name not in PROJECTS:
        raise ScenarioError(f"--project {project_name}: one of {', '.join(PROJECTS)}")
    project = PROJECTS[project_name]
    commits = commits_between(repo, good, bad)
    result = Bisection(run_id, project_name, str(repo), good, bad)
    with tempfile.TemporaryDirectory(prefix="parity-bisect-") as tmp:
        def verdict_of(commit: str) -> str:
            trial = run_at(project, repo, commit, files, run_id, Path(tmp), timeout_s, cache_dir.resolve())
            result.trials.append(trial)
            say(f"{commit[:10]} {trial.verdict:<5} {trial.subject}" + (f" — {trial.reason}" if trial.reason else ""))
            return trial.verdict

        first, candidates = search(commits, verdict_of)
    if first is not None:
        result.first_bad = commits[first]
        result.subject = _git(repo, "log", "-1", "--format=%s", result.first_bad)
    result.candidates = [commits[i] for i in candidates]
    return result


def write(out: Path, bisections: list[Bisection]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / BISECT_FILE
    path.write_text(json.dumps([b.to_json() for b in bisections], indent=1))
    return path


def load(out: Path) -> list[dict[str, Any]]:
    """The bisections stored in a run's out dir ([] when none ran)."""
    path = out / BISECT_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else []
    except ValueError:
        return []
    return data if isinstance(data, list) else []


def source_tree(row: dict[str, Any], project: Project) -> tuple[str, str] | None:
    """(tree, commit) a row's run imported the project from, from its provenance; None for an installed package."""
    info = (row.get("provenance") or {}).get(project.package)
    if not isinstance(info, dict) or not info.get("commit"):
        return None
    tree = info.get("source") if project.variable == "PARITY_VERL_SRC" else info.get("tree") or info.get("root")
    return (str(tree), str(info["commit"])) if tree else None


def flipped(previous: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Project,
                                                                                         str, str, str]]:
    """(row, project, tree, good commit, bad commit) for every row that PASSed before and FAILs now, ran against a
    source tree of a project, and whose commit there moved."""
    before = {r["id"]: r for r in previous}
    found = []
    for row in current:
        old = before.get(row["id"])
        if old is None or old.get("verdict") != "PASS" or row.get("verdict") != "FAIL":
            continue
        for project in PROJECTS.values():
            now, then = source_tree(row, project), source_tree(old, project)
            if now and then and now[1] != then[1]:
                found.append((row, project, now[0], then[1], now[1]))
    return found
