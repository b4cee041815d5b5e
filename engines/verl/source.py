"""Which verl runs: the installed package, or a source tree named by PARITY_VERL_SRC (a checkout of a PR branch:
how verl's own CI would use this harness). Torch-free and import-free: the harness asks before it launches, and
every process that imports verl calls `activate()` first, so the harness process, the forkserver and the ranks
import the same verl.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

SRC_VAR = "PARITY_VERL_SRC"
SUPPORTED = SpecifierSet(">=0.9.1,<0.11", prereleases=True)
"""verl releases the device shims and read-backs were written against (0.9.1 from PyPI; main at 0.10.0.dev).
Another version SKIPs naming itself: its engines may have moved the code the shims bridge."""
REQUIRED_MODULES = ("hydra", "omegaconf", "tensordict")
"""What the verl engines import besides verl (verl's own dependencies, checked so a half-installed verl SKIPs)."""


def activate() -> None:
    """Put PARITY_VERL_SRC first on sys.path (idempotent)."""
    src = os.environ.get(SRC_VAR)
    if src and src not in sys.path:
        sys.path.insert(0, src)


@cache
def package_dir() -> Path | None:
    """verl's package directory as this process would import it (not importing it)."""
    activate()
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def version() -> str | None:
    """verl's version from its own version file (a source tree has no distribution metadata)."""
    root = package_dir()
    if root is None:
        return None
    version_file = root / "version" / "version"
    if version_file.is_file():
        return version_file.read_text().strip()
    try:
        return md.version("verl")
    except md.PackageNotFoundError:
        return None


def problem() -> str | None:
    """Why the verl engines cannot run here (None: they can)."""
    root = package_dir()
    if root is None:
        return f"verl is not installed (pip install -e '.[verl]' -c ci/constraints-verl.txt, or set {SRC_VAR})"
    found = version()
    try:
        if found is None or Version(found) not in SUPPORTED:
            return (f"verl {found} at {root} is not a version the harness's verl shims know ({SUPPORTED}); "
                    "see docs/verl.md")
    except InvalidVersion:
        return f"verl at {root} has an unreadable version {found!r}"
    for module in REQUIRED_MODULES:
        if importlib.util.find_spec(module) is None:
            return f"verl's dependency {module} is not installed"
    return None


def provenance() -> dict[str, str | None]:
    """What the record says about the verl that ran: version, where from, and its commit when it is a checkout."""
    root = package_dir()
    info: dict[str, str | None] = {"version": version(), "path": str(root) if root else None,
                                   "source": os.environ.get(SRC_VAR) or "installed package", "commit": None}
    tree = os.environ.get(SRC_VAR)
    if tree:
        try:
            head = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10, check=False)
            info["commit"] = head.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            info["commit"] = None
    return info
