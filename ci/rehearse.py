#!/usr/bin/env python3
"""The nightly's dress rehearsal on CPU: the Ascend path of .github/workflows/nightly.yml (and goldens.yml's record
→ publish path feeding it) executed job by job, step for step, before a runner sees it (ci/rehearsal/).

    python ci/rehearse.py [--rows one|all] [--work DIR] [--repo TREE] [--mindspeed TREE] [--source OWNER/NAME=DIR]

What plays what:
- each workflow: its jobs in `needs` order with their `if:`s, matrices, outputs and step conditions (runner.py);
- a hosted runner: a clean CPython (3.12, nothing installed), an empty HOME, `gh` and `git clone` stand-ins;
- actions/checkout, setup-python (a clean CPython of the version), upload/download-artifact, the pages actions:
  local equivalents over folders (actions.py);
- an Ascend runner set (`linux-aarch64-a2b3-8`, `-a3-16`): its container image is a clean CPython 3.11 with the
  image's stack (torch, transformers, Megatron-Core of the stack; MindSpeed when --mindspeed names a tree) and the
  emulated torch_npu on its path, PARITY_EMULATED_NPU_CARDS = the set's cards, its HCCL group the emulated one
  (refusing what HCCL refuses), and no package index inside;
- the repository variables: the runners switched on, the images, tiny checkpoints for the model paths.
`--rows one` (what .ci/run does) dispatches the nightly with `device: npu` and a `k` that selects one row per lane;
`--rows all` runs every Ascend row on its CPU-sized model (the nightly's cpu job).
Exit 0: every job that should run ran green and the merged report was published; 1: a job failed (the step is
named, with its log's tail); 2: bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rehearsal import machines
from rehearsal.runner import JobResult, Stage, StepResult, run_workflow
from rehearsal.workflow import dispatch_defaults, load

ROOT = machines.ROOT
#: the GitHub repositories the nightly clones, and the variables that name a local tree of each
UPSTREAM_TREES = {"verl-project/verl": "PARITY_VERL_SRC", "vllm-project/vllm-ascend": "PARITY_VLLM_ASCEND_SRC"}
#: the images the nightly's `pick` step names, by the repository variable that overrides each
IMAGE_VARIABLES = {"PARITY_IMAGE_CURRENT_910B": "current", "PARITY_IMAGE_CURRENT_A3": "current",
                   "PARITY_IMAGE_CORE012_910B": "core012"}
#: model-path variables of the nightly -> the tiny architecture that stands in for each checkpoint
MODEL_VARIABLES = {"QWEN3_0_6B_PATH": "tiny-qwen3", "QWEN3_8B_PATH": "tiny-qwen3-wide",
                   "QWEN3_30B_A3B_PATH": "tiny-qwen3-moe-wide"}
#: one row per lane (`--rows one`): each lane's markers pick its own from this union; rows that need no MindSpeed
#: where the rehearsal has none
ONE_ROW_PER_LANE = ("tiny-qwen3/fsdp2/dp2/bf16/npu or tiny-qwen3/fsdp2/dp2/fp32/npu or "
                    "qwen3-0-6b/fsdp2/dp8/bf16/npu or qwen3-8b/fsdp2/dp8/bf16/npu+a3 or "
                    "tiny-qwen3/fsdp2/dp4-2nodes/fp32/npu")
#: the goldens those rows reference (scenarios/goldens.yaml ids on the rehearsal's device)
GOLDEN_ROWS = "qwen3-8b/fsdp2/dp8/bf16/cpu"


#: what MindSpeed imports at load (triton 3.5.1 runs on CPU: docs/ascend.md, the emulated lane)
MINDSPEED_IMPORTS = ("triton==3.5.1", "einops", "scipy")


def images(work: Path, mindspeed: Path | None, mindspeed_core012: Path | None) -> dict[str, Path]:
    """One image per stack: its Megatron-Core (the constraints file of its lane) and, where given, its MindSpeed."""
    built: dict[str, Path] = {}
    specs = {"current": machines.ImageSpec("image-current", "3.11", "ci/constraints-cpu.txt",
                                           ("transformers", "safetensors", "megatron-core",
                                            *(MINDSPEED_IMPORTS if mindspeed else ())), mindspeed),
             "core012": machines.ImageSpec("image-core012", "3.11", "ci/constraints-megatron012.txt",
                                           ("transformers", "safetensors", "megatron-core", "psutil",
                                            *(MINDSPEED_IMPORTS if mindspeed_core012 else ())), mindspeed_core012)}
    for stack, spec in specs.items():
        built[stack] = machines.build_image(spec, work / "images")
    return {f"rehearsal/{stack}": path for stack, path in built.items()}


def torch_index(work: Path) -> str:
    """A local stand-in for PyTorch's CPU index (PARITY_TORCH_INDEX_URL of the hosted jobs): a PEP 503 index of
    the CPU torch of ci/torch.txt and what it depends on, as that index serves them. Returns its file:// URL."""
    import re
    import subprocess

    index = work / "torch-index"
    if not (index / "torch" / "index.html").is_file():
        wheels = work / "cache" / "torch-wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), "-r",
                        str(ROOT / "ci" / "torch.txt")], check=True)
        for wheel in wheels.glob("*.whl"):
            project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
            (index / project).mkdir(parents=True, exist_ok=True)
            link = index / project / wheel.name
            if not link.exists():
                link.symlink_to(wheel)
        for project in index.iterdir():
            anchors = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(project.glob("*.whl")))
            (project / "index.html").write_text(f"<html><body>{anchors}</body></html>")
    return index.as_uri()


def tiny_checkpoints(work: Path) -> dict[str, str]:
    """A saved tiny checkpoint per model-path variable, named as the real model (the id a row gets)."""
    from parity.harness.config.models import ensure_checkpoint

    found = {}
    for variable, tiny in MODEL_VARIABLES.items():
        name = variable.removesuffix("_PATH").lower().replace("_", "-")
        target = work / "models" / name
        if not (target / "config.json").is_file():
            shutil.copytree(ensure_checkpoint(tiny, work / "model-cache"), target, dirs_exist_ok=True)
        found[variable] = str(target)
    return found


def gpu_runner(work: Path, image: Path) -> Path:
    """verl's GPU runner set (goldens.yml's L20x8) as the rehearsal has it: a machine whose Python already holds torch
    (the current image's), in a venv of its own so that the workflow's `pip install -e .` leaves the image alone."""
    import subprocess

    venv = work / "runners" / "gpu"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([str(image / "python3"), "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True)
    return venv / "bin"


def published_goldens(releases: Path) -> dict[str, str]:
    """The repository variables that pin the set goldens.yml published (the tag and its manifest's sha256)."""
    import hashlib
    import tarfile

    tags = sorted(p for p in releases.glob("goldens-*") if (p / "goldens.tar.gz").is_file())
    if not tags:
        return {}
    with tarfile.open(tags[-1] / "goldens.tar.gz") as archive:
        member = archive.extractfile("./manifest.json") or archive.extractfile("manifest.json")
        digest = hashlib.sha256(member.read()).hexdigest() if member else ""
    return {"PARITY_GOLDENS_TAG": tags[-1].name, "PARITY_GOLDENS_SHA256": digest}


def report(results: list[JobResult], work: Path) -> int:
    failed = [r for r in results if r.result == "failure"]
    for result in results:
        mark = {"success": "ok  ", "failure": "FAIL", "skipped": "skip"}[result.result]
        print(f"{mark} {result.label}: {result.why}")
    for result in failed:
        step = next((s for s in result.steps if s.conclusion == "failure"), None)
        where = f'step "{step.name}" ({step.note})' if step else result.why
        print(f"\nFAILED: job {result.label}, {where}")
        if step and step.log and step.log.is_file():
            tail = step.log.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(f"    {line}" for line in tail))
            print(f"    (log: {step.log})")
    return 1 if failed else 0


def progress(result: JobResult, step: StepResult) -> None:
    print(f"  [{result.label}] {step.conclusion:8s} {step.seconds:6.1f}s  {step.name}"
          + (f"  ({step.note})" if step.note else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", choices=("one", "all"), default="one")
    parser.add_argument("--work", type=Path, help="work folder (kept; default: a new temporary one)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the tree to rehearse (default: this checkout)")
    parser.add_argument("--mindspeed", type=Path, help="a MindSpeed core_r0.16.0 tree for the current stack's image")
    parser.add_argument("--mindspeed-core012", type=Path,
                        help="a MindSpeed 2.3.0_core_r0.12.1 tree for the core012 stack's image")
    parser.add_argument("--source", action="append", default=[], metavar="OWNER/NAME=DIR",
                        help="a local tree standing in for a GitHub repository (checkout, git clone)")
    parser.add_argument("--jobs", help="only these jobs of either workflow, comma-separated (the others skip)")
    parser.add_argument("--no-goldens", action="store_true", help="do not rehearse goldens.yml first")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="a repository variable as a night may have it (NAME= is an unset one: GitHub gives '')")
    parser.add_argument("--time-scale", type=float, default=0.25,
                        help="jobs' timeout-minutes times this (the rows are CPU-sized)")
    args = parser.parse_args(argv)
    sources = {}
    # the upstream trees the workflows clone (the prepare job's stack check), from the environment where given
    for name, variable in UPSTREAM_TREES.items():
        if os.environ.get(variable):
            args.source.insert(0, f"{name}={os.environ[variable]}")
    for given in args.source:
        name, _, folder = given.partition("=")
        if not folder or not Path(folder).is_dir():
            parser.error(f"--source {given}: want OWNER/NAME=DIR with an existing DIR")
        sources[name] = Path(folder).resolve()
    work = (args.work or Path(tempfile.mkdtemp(prefix="parity-rehearsal-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for run_scoped in ("artifacts", "pages", "releases", "jobs", "logs"):  # kept: images, caches, models
        shutil.rmtree(work / run_scoped, ignore_errors=True)
    started = time.monotonic()
    print(f"rehearsal of {args.repo} in {work}", flush=True)
    image_dirs = images(work, args.mindspeed, args.mindspeed_core012)
    variables = {"PARITY_ASCEND_RUNNERS": "true", "PARITY_PAGES": "true",
                 **{v: f"rehearsal/{stack}" for v, stack in IMAGE_VARIABLES.items()}, **tiny_checkpoints(work)}
    # the runners' package caches outlive a run, as a runner's tool cache does (what they hold is what the registry
    # serves; a cache never changes what a step installs)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "parity-rehearsal"
    runner_env = {"PARITY_WHEELHOUSE_PLATFORM": "host", "PIP_CACHE_DIR": str(cache / "pip"),
                  "UV_CACHE_DIR": str(cache / "uv"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    url_map = {"https://download.pytorch.org/whl/cpu": torch_index(work)}
    print(f"images: {', '.join(image_dirs)}; variables: {json.dumps(variables)}", flush=True)
    # 1. goldens.yml, dispatched as a maintainer records a set: on CPU here, the rows the big lanes reference
    goldens = load(args.repo / ".github" / "workflows" / "goldens.yml")
    record = {"device": "cpu", "k": GOLDEN_ROWS if args.rows == "one" else ""}
    stage = Stage(args.repo.resolve(), work, "workflow_dispatch", dispatch_defaults(goldens, record), variables,
                  image_dirs, sources, runner_env, time_scale=args.time_scale, url_map=url_map, on_step=progress,
                  self_hosted={"L20x8": gpu_runner(work, image_dirs["rehearsal/current"])},
                  jobs_only=frozenset(args.jobs.split(",")) if args.jobs else None)
    results: list[JobResult] = []
    if not args.no_goldens:
        print("== goldens.yml (record, publish)", flush=True)
        results += run_workflow(stage, goldens)
    # 2. the nightly, with the published set pinned as the repository variables pin it
    pinned = published_goldens(stage.releases)
    nightly = load(args.repo / ".github" / "workflows" / "nightly.yml")
    given = {"device": "npu"} | ({"k": ONE_ROW_PER_LANE} if args.rows == "one" else {})
    given_vars = dict(item.partition("=")[::2] for item in args.var)
    stage.variables = {**variables, **pinned, **given_vars}
    stage.inputs = dispatch_defaults(nightly, given)
    print(f"== nightly.yml (goldens pinned: {pinned or 'none'})", flush=True)
    results += run_workflow(stage, nightly)
    code = report(results, work)
    must_publish = args.jobs is None or "report" in args.jobs.split(",")
    if code == 0 and must_publish and not (stage.artifacts / "parity-merged" / "report.html").is_file():
        print("FAILED: no job published parity-merged/report.html")
        code = 1
    print(f"rehearsal {'green' if code == 0 else 'RED'} in {time.monotonic() - started:.0f} s ({work})")
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
