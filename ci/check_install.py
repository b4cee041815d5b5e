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


def import_names(dist: str) -> list[str]:
    """Top-level modules a distribution provides (yaml for pyyaml, xdist for pytest-xdist)."""
    wanted = dist.lower().replace("_", "-")
    names = [module for module, dists in md.packages_distributions().items()
             if wanted in {d.lower().replace("_", "-") for d in dists}]
    return sorted(n for n in names if not n.startswith("_")) or [dist.replace("-", "_")]


def problems() -> list[str]:
    found = []
    for text in md.requires(DIST) or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement (megatron, verl, dev): the image brings its own
        try:
            installed = md.version(requirement.name)
        except md.PackageNotFoundError:
            found.append(f"{requirement.name}: not installed ({requirement})")
            continue
        if installed not in requirement.specifier:
            found.append(f"{requirement.name}: {installed} is installed, the harness needs {requirement}")
            continue
        for module in import_names(requirement.name):
            try:
                importlib.import_module(module)
            except Exception as exc:  # a broken install is as fatal as a missing one
                found.append(f"{requirement.name}: import {module} failed: {type(exc).__name__}: {exc}")
    try:
        importlib.import_module("parity.harness.pytest_plugin")
    except Exception as exc:
        found.append(f"{DIST}: its pytest plugin does not import: {type(exc).__name__}: {exc}")
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
