#!/usr/bin/env python3
"""The Ascend images the nightly names, against verl's own image builds.

    python ci/check_ascend_stack.py VERL_DIR   # a checkout of verl-project/verl

The nightly's `prepare` job states each default image once (.github/workflows/nightly.yml, step `pick`). For each,
this finds the Dockerfile verl builds it from (docker/ascend/supported_tags.md, else a tag a
.github/workflows/docker-build-ascend-*.yml pushes) and reads what that Dockerfile installs: the MindSpeed branch,
the Megatron-LM branch and the torch pin. A finding: an image verl builds from no Dockerfile its workflows still
build (it no longer updates), or a current image whose torch minor differs from the emulated torch_npu's
(tests/emulated_npu/site/torch_npu `__version__`). Prints the facts table, then the findings; exit 1 with findings.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NIGHTLY = ROOT / ".github" / "workflows" / "nightly.yml"
EMULATED = ROOT / "tests" / "emulated_npu" / "site" / "torch_npu" / "__init__.py"
_LITERAL = re.compile(r"'([^']+)'\s*\}\}\s*$")
_TAG_ROW = re.compile(r"`([^`]+)`\s*\|\s*\[(Dockerfile[^\]]+)\]")
_FILE = re.compile(r"file:\s*\./docker/ascend/(Dockerfile\S+)")
_PUSHED_TAG = re.compile(r"""tag=([\w.-]+)|:([\w.-]+)["']\s*\\?$""", re.M)
_MINDSPEED = re.compile(r"cd MindSpeed && git checkout (\S+)")
_MEGATRON = re.compile(r"--branch (\S+) https://github\.com/NVIDIA/Megatron-LM")
_TORCH = re.compile(r"torch==(\d+\.\d+)(?:\.\d+)?")
_VERSION = re.compile(r"""^__version__\s*=\s*['"](\d+\.\d+)""", re.M)


@dataclass(frozen=True)
class Image:
    variable: str
    image: str
    dockerfile: str | None
    built: bool
    mindspeed: str | None
    megatron: str | None
    torch: str | None


def nightly_images(nightly: Path = NIGHTLY) -> dict[str, str]:
    """The `pick` step's env: variable -> the default image (the literal after the last `||`)."""
    jobs = yaml.safe_load(nightly.read_text())["jobs"]
    pick = next(s for s in jobs["prepare"]["steps"] if s.get("id") == "pick")
    return {k: m.group(1) for k, v in pick["env"].items() if (m := _LITERAL.search(str(v)))}


def verl_builds(verl: Path) -> dict[str, str]:
    """Tag -> Dockerfile for every image verl's Ascend build workflows push (tags and `file:` paired in order)."""
    built: dict[str, str] = {}
    for workflow in sorted((verl / ".github" / "workflows").glob("docker-build-ascend-*.yml")):
        text = workflow.read_text()
        files = list(dict.fromkeys(_FILE.findall(text)))
        tags = list(dict.fromkeys(a or b for a, b in _PUSHED_TAG.findall(text)))
        tags = [t for t in tags if not t.startswith("tmp-")]
        built.update(zip(tags, files))
    return built


def supported_tags(verl: Path) -> dict[str, str]:
    table = verl / "docker" / "ascend" / "supported_tags.md"
    return dict(_TAG_ROW.findall(table.read_text())) if table.is_file() else {}


def facts(verl: Path, nightly: Path = NIGHTLY) -> list[Image]:
    built, listed = verl_builds(verl), supported_tags(verl)
    found = []
    for variable, image in nightly_images(nightly).items():
        tag = image.rsplit(":", 1)[-1]
        dockerfile = built.get(tag) or listed.get(tag)
        text = ""
        if dockerfile and (path := verl / "docker" / "ascend" / dockerfile).is_file():
            text = path.read_text()
        ms, mg, torch = _MINDSPEED.search(text), _MEGATRON.search(text), _TORCH.search(text)
        found.append(Image(variable, image, dockerfile, tag in built, ms.group(1) if ms else None,
                           mg.group(1) if mg else None, torch.group(1) if torch else None))
    return found


def findings(images: list[Image], emulated: Path = EMULATED) -> list[str]:
    problems = []
    version = _VERSION.search(emulated.read_text())
    for image in images:
        if not image.built:
            problems.append(f"{image.variable}: {image.image} is built by none of verl's docker-build-ascend "
                            f"workflows ({image.dockerfile or 'no Dockerfile found'}): it no longer updates")
        if image.variable.startswith("CURRENT") and image.torch and version and version.group(1) != image.torch:
            problems.append(f"{image.variable}: {image.image} installs torch {image.torch} ({image.dockerfile}) but "
                            f"the emulated torch_npu says {version.group(1)} ({emulated.relative_to(ROOT)})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python ci/check_ascend_stack.py VERL_DIR", file=sys.stderr)
        return 2
    images = facts(Path(args[0]))
    print("| variable | image | Dockerfile | built by verl | MindSpeed | Megatron-LM | torch |")
    print("|---|---|---|---|---|---|---|")
    for i in images:
        print(f"| {i.variable} | `{i.image.rsplit(':', 1)[-1]}` | {i.dockerfile or '—'} | {'yes' if i.built else 'NO'} "
              f"| {i.mindspeed or '—'} | {i.megatron or '—'} | {i.torch or '—'} |")
    problems = findings(images)
    for problem in problems:
        print(f"::warning title=Ascend stack::{problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
