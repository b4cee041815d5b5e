"""Which MindSpeed is installed, and whether it fits the installed megatron-core — torch-free, nothing imported.

MindSpeed is cut in branches per Megatron-Core release: `core_r0.16.0` patches megatron-core 0.16, every
`<release>_core_r0.12.1` branch (verl's older images ship `2.3.0_core_r0.12.1`) and `master` patch 0.12.1, and
`core_r0.17.0` / `core_r0.18.0` patch 0.17.1. What a branch pairs with is what its README tells the user to install:
the `git checkout <ref>` after `cd Megatron-LM` in its install steps, else its version table's Megatron row
(`| Mcore版本 | 0.16.0 |`, `| Megatron-LM 版本 | 0.17.1 |`). setup.py's `__version__` is NOT that: it says 0.12.1
on core_r0.17.0 / core_r0.18.0 (a copy from master), and core_r0.14.0's version table is one (it says 0.12.1 where
its install steps check out core_r0.14.0). MindSpeed's patches replace private Megatron functions by name, so a
tree paired with another minor release breaks in ways that look like engine bugs (master's CP code calls
`initialize_model_parallel` positionally in 0.12's argument order): the engines refuse that pairing by name
(`EngineSpec.environment_check` SKIPs such scenarios; setup raises). Branches from core_r0.17.0 also declare
MegatronAdaptor (`import megatron_adaptor`), which must then be installed.
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
_CD_MEGATRON = re.compile(r"^\s*cd\s+Megatron-LM/?\s*$")
_CHECKOUT = re.compile(r"^\s*git\s+checkout\s+(\S+)")
_TABLE_ROW = re.compile(r"^\|\s*(Mcore版本|Megatron-LM\s*版本)\s*\|\s*v?(\d+\.\d+(?:\.\d+)?)\s*\|", re.M)
_ADAPTOR_ROW = re.compile(r"^\|\s*MegatronAdaptor\s*\|\s*(\S+)\s*\|", re.M)
_RELEASE = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True, slots=True)
class Pairing:
    """The megatron-core release a MindSpeed branch declares it patches, and where it says so."""

    megatron: str
    """'0.16.0', '0.17.1', '0.12.1'."""
    declared_by: str
    """'README.md: git checkout core_r0.16.0 (Megatron-LM)', 'README.md version table', 'setup.py __version__'."""
    megatron_adaptor: str | None = None
    """The MegatronAdaptor ref its README names (core_r0.17.0 on; None before)."""


def declared_pairing(readme: str | None, setup_version: str | None) -> Pairing | None:
    """What a branch's README says it pairs with (install steps first, then the version table); setup.py's version
    only when the README says nothing."""
    adaptor = _ADAPTOR_ROW.search(readme or "")
    adaptor_ref = adaptor.group(1) if adaptor else None
    lines = (readme or "").splitlines()
    for i, line in enumerate(lines):
        if not _CD_MEGATRON.match(line):
            continue
        for following in lines[i + 1:i + 6]:
            if not (checkout := _CHECKOUT.match(following)):
                continue
            if release := _RELEASE.search(checkout.group(1)):
                return Pairing(release.group(1), f"README.md: git checkout {checkout.group(1)} (Megatron-LM)",
                               adaptor_ref)
            # a commit, not a release (MindSpeed's `dev`): that is the pairing, and no release matches it
            return Pairing(checkout.group(1), f"README.md: git checkout {checkout.group(1)} (Megatron-LM, a commit "
                           "of no release)", adaptor_ref)
    if row := _TABLE_ROW.search(readme or ""):
        return Pairing(row.group(2), f"README.md version table ({row.group(1).strip()} {row.group(2)})", adaptor_ref)
    if setup_version is not None:
        return Pairing(setup_version, "setup.py __version__ (the README names no Megatron release)", adaptor_ref)
    return None


@dataclass(frozen=True, slots=True)
class MindSpeedSource:
    """The MindSpeed on the path, as its files describe it."""

    root: str | None
    """The directory holding the `mindspeed` package (a source tree or site-packages)."""
    version: str | None
    """setup.py `__version__` of a source tree, else the installed distribution's version (not the pairing:
    `pairs_with`)."""
    commit: str | None
    """The tree's git commit (a clone) or the commit pip recorded (direct_url.json); None for an extracted tree."""
    has_fsdp: bool
    """Whether it has `mindspeed/fsdp` (MindSpeed's FSDP engine; which branches do: docs/ascend.md's pairing table)."""
    pairs_with: str | None = None
    """The megatron-core release its README declares (declared_pairing)."""
    pairing_declared_by: str | None = None
    megatron_adaptor: str | None = None

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
    pairing = declared_pairing(_readme(root, dist), version)
    return MindSpeedSource(root=str(root), version=version, commit=commit, has_fsdp=(package / "fsdp").is_dir(),
                           pairs_with=pairing.megatron if pairing else None,
                           pairing_declared_by=pairing.declared_by if pairing else None,
                           megatron_adaptor=pairing.megatron_adaptor if pairing else None)


def _readme(root: Path, dist: md.Distribution | None) -> str | None:
    """The tree's README.md; for a non-editable install, the long description pip recorded (MindSpeed's setup.py
    reads README.md into it)."""
    try:
        return (root / "README.md").read_text(errors="replace")
    except OSError:
        pass
    if dist is None:
        return None
    metadata = dist.read_text("METADATA") or ""
    return metadata.partition("\n\n")[2] or None


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


def pairing_problem(pairs_with: str | None, mcore_version: str | None, where: str = "",
                    declared_by: str = "") -> str | None:
    """Why this MindSpeed cannot patch this megatron-core (None: the pairing is right, or not known to be wrong)."""
    if pairs_with is None or mcore_version is None:
        return None
    ms, mc = _minor(pairs_with), _minor(mcore_version)
    if ms is None or mc is None or ms == mc:
        return None
    line = f"{ms[0]}.{ms[1]}"
    said = f" ({declared_by})" if declared_by else ""
    return (f"MindSpeed{f' at {where}' if where else ''} pairs with megatron-core {pairs_with}{said}, but "
            f"megatron-core {mcore_version} is installed; install megatron-core {line}.x or a MindSpeed branch cut "
            f"for megatron-core {mc[0]}.{mc[1]} (core_r{mc[0]}.{mc[1]}.*)")


def adaptor_problem(source: MindSpeedSource) -> str | None:
    """A branch that declares MegatronAdaptor (core_r0.17.0 on) without it installed."""
    if source.megatron_adaptor is None:
        return None
    try:
        found = importlib.util.find_spec("megatron_adaptor") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else (f"MindSpeed at {source.root} declares MegatronAdaptor {source.megatron_adaptor} "
                               "(README.md) and `megatron_adaptor` is not importable: install "
                               "https://gitcode.com/Ascend/MegatronAdaptor at that ref")


def megatron_pairing_problem() -> str | None:
    """`environment_check` of mindspeed_megatron: a known-bad MindSpeed <-> megatron-core pairing."""
    source = find_mindspeed()
    if source is None:
        return None
    return (pairing_problem(source.pairs_with, megatron_core_version(), source.root or "",
                            source.pairing_declared_by or "") or adaptor_problem(source))
