#!/usr/bin/env python3
"""After ci/nightly.sh installed the harness into an Ascend image with --no-index: every runtime requirement the
installed parity-harness declares is present at a version it accepts and imports, and so does the pytest plugin.
A lane then fails here, naming the package, instead of halfway through its scenarios.

    python ci/check_install.py        exit 0: all present; 1: what is missing or broken, one line each
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

DIST = "parity-harness"
PLUGIN = "parity.harness.pytest_plugin"


def import_names(dist: str) -> list[str]:
    """Top-level modules a distribution provides (yaml for pyyaml, xdist for pytest-xdist)."""
    wanted = dist.lower().replace("_", "-")
    names = [module for module, dists in md.packages_distributions().items()
             if wanted in {d.lower().replace("_", "-") for d in dists}]
    return sorted(n for n in names if not n.startswith("_")) or [dist.replace("-", "_")]


def version_problem(requirement: Requirement, installed: str) -> str | None:
    """Why the installed version does not meet the requirement (None when it does). Pre-releases are accepted
    explicitly: `installed in requirement.specifier` refuses 5.0.0.dev0 (an editable transformers from a git
    commit) under packaging < 26 and accepts it from 26 on, so the image's packaging would decide the lane."""
    try:
        if requirement.specifier.contains(installed, prereleases=True):
            return None
    except ValueError as exc:  # packaging 22-25 raise InvalidVersion for a version PEP 440 cannot read
        return f"{requirement.name}: {installed} is installed, a version packaging cannot read ({exc})"
    return f"{requirement.name}: {installed} is installed, the harness needs {requirement}"


def problems(dist: str = DIST, plugin: str | None = PLUGIN) -> list[str]:
    found = []
    for text in md.requires(dist) or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement (megatron, verl, dev): the image brings its own
        try:
            installed = md.version(requirement.name)
        except md.PackageNotFoundError:
            found.append(f"{requirement.name}: not installed ({requirement})")
            continue
        if problem := version_problem(requirement, installed):
            found.append(problem)
            continue
        for module in import_names(requirement.name):
            try:
                importlib.import_module(module)
            except Exception as exc:  # a broken install is as fatal as a missing one
                found.append(f"{requirement.name}: import {module} failed: {type(exc).__name__}: {exc}")
    try:
        if plugin is not None:
            importlib.import_module(plugin)
    except Exception as exc:
        found.append(f"{dist}: its pytest plugin does not import: {type(exc).__name__}: {exc}")
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(f"check_install: {line}", file=sys.stderr)
    if not found:
        print(f"check_install: every requirement of {DIST} {md.version(DIST)} is installed and imports")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
