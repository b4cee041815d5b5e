"""Local equivalents of the `uses:` actions the workflows name: what each does to the job's workspace, its
environment and the run's stores (artifacts, the pages site). Anything else is refused, naming the action."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ActionFailed(RuntimeError):
    """The action failed as the real one would (a missing artifact, no files to upload)."""


@dataclass(slots=True)
class ActionContext:
    repo: Path
    """The tree under test (its tracked and untracked-but-not-ignored files are what a checkout gives)."""
    workspace: Path
    artifacts: Path
    pages: Path
    sources: dict[str, Path]
    """owner/name -> a local tree standing in for that GitHub repository (a checkout of another repository)."""
    python: Callable[[str], Path]
    """A Python version -> the bin/ of a clean CPython of that version (setup-python)."""
    in_container: bool
    own_repository: str


def _copy_tree(source: Path, target: Path, files: list[str] | None = None) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if files is None:
        shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
        return
    for name in files:
        src = source / name
        if src.is_file() or src.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / name, follow_symlinks=False)


def checkout(ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    repository = str(inputs.get("repository") or ctx.own_repository)
    target = ctx.workspace / str(inputs.get("path") or "")
    if repository == ctx.own_repository:
        listed = subprocess.run(["git", "-C", str(ctx.repo), "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, text=True, check=False)
        if listed.returncode == 0:
            _copy_tree(ctx.repo, target, [name for name in listed.stdout.split("\0") if name])
        else:  # a plain tree (a test's planted copy): everything but what a clone never has
            shutil.copytree(ctx.repo, target, dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns(".git", ".venv", "parity-out", "__pycache__"))
        return {}
    if repository not in ctx.sources:
        raise ActionFailed(f"actions/checkout of {repository}: no network here; give the rehearsal a local tree "
                           f"(--source {repository}=DIR)")
    _copy_tree(ctx.sources[repository], target)
    return {}


def setup_python(ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    version = str(inputs.get("python-version") or "3.11")
    return {"__path__": str(ctx.python(version))}


def _globbed(base: Path, pattern: str) -> list[Path]:
    pattern = pattern.strip()
    if not pattern:
        return []
    if any(ch in pattern for ch in "*?["):
        return sorted(base.glob(pattern))
    path = base / pattern
    return [path] if path.exists() else []


def upload_artifact(ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    name = str(inputs.get("name") or "artifact")
    found = [p for line in str(inputs.get("path", "")).splitlines() for p in _globbed(ctx.workspace, line)]
    files = [f for p in found for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()))]
    if not files:
        behaviour = str(inputs.get("if-no-files-found") or "warn")
        if behaviour == "error":
            raise ActionFailed(f"upload-artifact {name}: no files found at {inputs.get('path')!r}")
        print(f"::warning::upload-artifact {name}: no files found at {inputs.get('path')!r}; nothing uploaded")
        return {}
    store = ctx.artifacts / name
    if store.exists():
        raise ActionFailed(f"upload-artifact {name}: an artifact of that name exists in this run (v4 never "
                           "overwrites)")
    # v4 keeps paths relative to the least common ancestor of what it uploads
    roots = [p if p.is_dir() else p.parent for p in found]
    common = Path(*Path(roots[0]).parts[:min(len(r.parts) for r in roots)])
    while not all(r.is_relative_to(common) for r in roots):
        common = common.parent
    for file in files:
        (store / file.relative_to(common)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, store / file.relative_to(common))
    return {"artifact-id": name}


def download_artifact(ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    target = ctx.workspace / str(inputs.get("path") or "")
    name, pattern = inputs.get("name"), inputs.get("pattern")
    if name:
        if not (ctx.artifacts / str(name)).is_dir():
            raise ActionFailed(f"download-artifact: no artifact named {name} in this run")
        _copy_tree(ctx.artifacts / str(name), target)
        return {"download-path": str(target)}
    names = sorted(p.name for p in ctx.artifacts.iterdir() if fnmatch.fnmatch(p.name, str(pattern or "*"))) \
        if ctx.artifacts.is_dir() else []
    merge = str(inputs.get("merge-multiple", "false")).lower() == "true"
    for each in names:
        _copy_tree(ctx.artifacts / each, target if merge else target / each)
    return {"download-path": str(target)}


def upload_pages_artifact(ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    site = ctx.workspace / str(inputs.get("path") or "_site")
    if not site.is_dir():
        raise ActionFailed(f"upload-pages-artifact: {site} is not a folder")
    store = ctx.artifacts / "github-pages"
    shutil.rmtree(store, ignore_errors=True)
    _copy_tree(site, store)
    return {}


def deploy_pages(ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    store = ctx.artifacts / "github-pages"
    if not store.is_dir():
        raise ActionFailed("deploy-pages: no github-pages artifact (upload-pages-artifact) in this run")
    shutil.rmtree(ctx.pages, ignore_errors=True)
    _copy_tree(store, ctx.pages)
    return {"page_url": ctx.pages.as_uri() + "/"}


ACTIONS: dict[str, Callable[[ActionContext, dict[str, Any]], dict[str, str]]] = {
    "actions/checkout": checkout,
    "actions/setup-python": setup_python,
    "actions/upload-artifact": upload_artifact,
    "actions/download-artifact": download_artifact,
    "actions/upload-pages-artifact": upload_pages_artifact,
    "actions/deploy-pages": deploy_pages,
}


def run_action(uses: str, ctx: ActionContext, inputs: dict[str, Any]) -> dict[str, str]:
    name = uses.split("@", 1)[0]
    if name not in ACTIONS:
        raise ActionFailed(f"{uses}: the rehearsal has no local equivalent of this action")
    return ACTIONS[name](ctx, inputs)
