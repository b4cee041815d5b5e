"""Which MindSpeed is installed, and whether it fits the installed megatron-core — torch-free, nothing imported.

MindSpeed is cut in branches per Megatron-Core release: `core_r0.16.0` patches megatron-core 0.16, and every
`<release>_core_r0.12.1` branch (verl's images ship `2.3.0_core_r0.12.1`) and `master` patch 0.12.1. A source
tree states that pairing as its setup.py `__version__` ('0.16.0', '0.12.1'), which is also the version pip records
when it is installed. MindSpeed's patches replace private Megatron functions by name, so a tree paired with another
minor release breaks in ways that look like engine bugs (master's CP code calls `initialize_model_parallel`
positionally in 0.12's argument order): the engines refuse that pairing by name (`EngineSpec.environment_check`
SKIPs such scenarios; setup raises).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_VERSION_LINE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)


@dataclass(frozen=True, slots=True)
class MindSpeedSource:
    """The MindSpeed on the path, as its files describe it."""

    root: str | None
    """The directory holding the `mindspeed` package (a source tree or site-packages)."""
    version: str | None
    """setup.py `__version__` of a source tree, else the installed distribution's version: the megatron-core
    release the branch is cut for."""
    commit: str | None
    """The tree's git commit (a clone) or the commit pip recorded (direct_url.json); None for an extracted tree."""
    has_fsdp: bool
    """Whether it has `mindspeed/fsdp` (MindSpeed's FSDP engine: master and 26.1.0_core_r0.12.1, not core_r0.16.0)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_mindspeed() -> MindSpeedSource | None:
    """The `mindspeed` package the path would import (found, never imported)."""
    try:
        spec = importlib.util.find_spec("mindspeed")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package.parent
    version = _setup_version(root / "setup.py")
    dist = _distribution()
    if version is None and dist is not None:
        version = dist.version
    commit = _git_commit(root) or (_recorded_commit(dist) if dist is not None else None)
    return MindSpeedSource(root=str(root), version=version, commit=commit, has_fsdp=(package / "fsdp").is_dir())


def _setup_version(setup: Path) -> str | None:
    try:
        found = _VERSION_LINE.search(setup.read_text(errors="replace"))
    except OSError:
        return None
    return found.group(1) if found else None


def _distribution() -> md.Distribution | None:
    try:
        return md.distribution("mindspeed")
    except md.PackageNotFoundError:
        return None


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _recorded_commit(dist: md.Distribution) -> str | None:
    """pip install from git records the commit in direct_url.json (PEP 610)."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        return json.loads(text).get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return None


def megatron_core_version() -> str | None:
    try:
        return md.version("megatron-core")
    except md.PackageNotFoundError:
        pass
    try:
        spec = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    info = Path(spec.origin).parent / "package_info.py"
    try:
        text = info.read_text()
    except OSError:
        return None
    parts = {k: re.search(rf"^{k}\s*=\s*(\S+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")}
    if not all(parts.values()):
        return None
    return ".".join(m.group(1).strip("'\"") for m in parts.values() if m)


def _minor(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def pairing_problem(mindspeed_version: str | None, mcore_version: str | None, where: str = "") -> str | None:
    """Why this MindSpeed cannot patch this megatron-core (None: the pairing is right, or not known to be wrong)."""
    if mindspeed_version is None or mcore_version is None:
        return None
    ms, mc = _minor(mindspeed_version), _minor(mcore_version)
    if ms is None or mc is None or ms == mc:
        return None
    line = f"{ms[0]}.{ms[1]}"
    return (f"MindSpeed{f' at {where}' if where else ''} is version {mindspeed_version} (a core_r{mindspeed_version} "
            f"branch: it patches megatron-core {line}.x) but megatron-core {mcore_version} is installed; install "
            f"megatron-core {line}.x or a MindSpeed branch cut for megatron-core {mc[0]}.{mc[1]} "
            f"(core_r{mc[0]}.{mc[1]}.*)")


def megatron_pairing_problem() -> str | None:
    """`environment_check` of mindspeed_megatron: a known-bad MindSpeed <-> megatron-core pairing."""
    source = find_mindspeed()
    if source is None:
        return None
    return pairing_problem(source.version, megatron_core_version(), source.root or "")

