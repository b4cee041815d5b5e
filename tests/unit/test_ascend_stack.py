"""ci/check_ascend_stack.py: the nightly's default Ascend images against verl's image builds. A planted verl tree
(its build workflow, supported tags and Dockerfiles) gives the clean twin and each finding: an image verl no longer
builds, a current image whose torch differs from the emulated torch_npu's. Where verl's source is on disk
($PARITY_VERL_SRC), the nightly's current images are checked against it."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "check_ascend_stack.py"
VERL = Path(os.environ.get("PARITY_VERL_SRC", "/work/src/verl-main"))
pytestmark = pytest.mark.torch_free


def _module():
    spec = importlib.util.spec_from_file_location("ci_check_ascend_stack", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stack = _module()

DOCKERFILE = """FROM cann:9.1.0
RUN git clone https://gitcode.com/Ascend/MindSpeed.git && \\
    cd MindSpeed && git checkout {mindspeed} && cd .. && \\
    git clone --depth 1 --branch {megatron} https://github.com/NVIDIA/Megatron-LM.git
RUN pip install torch=={torch}+cpu --index-url https://download.pytorch.org/whl/cpu/
"""
BUILD = """name: build
jobs:
  build:
    steps:
      - run: echo "tag=latest-vllm-910b-ubuntu" >> "$GITHUB_OUTPUT"
      - uses: docker/build-push-action@v6
        with:
          file: ./docker/ascend/Dockerfile.current_a2
  build-a3:
    steps:
      - run: echo "tag=latest-vllm-a3-ubuntu" >> "$GITHUB_OUTPUT"
      - uses: docker/build-push-action@v6
        with:
          file: ./docker/ascend/Dockerfile.current_a3
"""


def _verl(tmp_path: Path, torch: str = "2.10.0") -> Path:
    verl = tmp_path / "verl"
    (verl / ".github" / "workflows").mkdir(parents=True)
    (verl / "docker" / "ascend").mkdir(parents=True)
    (verl / ".github" / "workflows" / "docker-build-ascend-a2.yml").write_text(BUILD)
    for name, ms, mg in (("Dockerfile.current_a2", "core_r0.16.0", "core_r0.16.0"),
                         ("Dockerfile.current_a3", "core_r0.16.0", "core_r0.16.0"),
                         ("Dockerfile.old_a2", "2.3.0_core_r0.12.1", "core_v0.12.1")):
        (verl / "docker" / "ascend" / name).write_text(DOCKERFILE.format(mindspeed=ms, megatron=mg, torch=torch))
    (verl / "docker" / "ascend" / "supported_tags.md").write_text(
        "| 910b | 8.5.0 | vLLM | `verl-8.5.0-910b-ubuntu22.04-py3.11-latest` | [Dockerfile.old_a2](x) |\n")
    return verl


def test_the_facts_come_from_verl_s_dockerfiles_and_a_dropped_image_is_found(tmp_path):
    images = {i.variable: i for i in stack.facts(_verl(tmp_path))}
    current = images["CURRENT_910B"]
    assert (current.dockerfile, current.built, current.mindspeed, current.megatron, current.torch) == \
        ("Dockerfile.current_a2", True, "core_r0.16.0", "core_r0.16.0", "2.10")
    assert images["CURRENT_A3"].built and images["CURRENT_A3"].dockerfile == "Dockerfile.current_a3"
    old = images["CORE012_910B"]
    assert (old.dockerfile, old.built, old.mindspeed) == ("Dockerfile.old_a2", False, "2.3.0_core_r0.12.1")
    problems = stack.findings(list(images.values()))
    assert len(problems) == 1 and problems[0].startswith("CORE012_910B") and "no longer updates" in problems[0]
    clean = [i for i in images.values() if i.variable != "CORE012_910B"]
    assert stack.findings(clean) == []  # the clean twin: built images, the emulation's torch_npu on their torch


def test_a_current_image_on_another_torch_than_the_emulation_is_found(tmp_path):
    images = [i for i in stack.facts(_verl(tmp_path, torch="2.9.0")) if i.variable.startswith("CURRENT")]
    problems = stack.findings(images)
    assert len(problems) == 2 and all("installs torch 2.9" in p and "emulated torch_npu says 2.10" in p
                                      for p in problems)


@pytest.mark.skipif(not (VERL / "docker" / "ascend").is_dir(), reason=f"no verl checkout at {VERL} "
                    "($PARITY_VERL_SRC)")
def test_the_nightly_s_current_images_are_the_ones_verl_builds():
    images = {i.variable: i for i in stack.facts(VERL)}
    for variable in ("CURRENT_910B", "CURRENT_A3"):
        assert images[variable].built and images[variable].mindspeed == "core_r0.16.0", images[variable]
    assert not [p for p in stack.findings(list(images.values())) if p.startswith("CURRENT")]
