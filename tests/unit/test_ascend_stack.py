"""ci/check_ascend_stack.py: the nightly's default Ascend images against verl's image builds and the stacks
ci/ascend_stacks.yaml declares. Small verl trees in tmp_path (a build workflow, supported_tags.md, Dockerfiles shaped
like verl's docker/ascend/Dockerfile.ascend_9.1.0_a2, a vllm-ascend git repository whose requirements.txt pins the
aarch64 torch) give the clean twin and one planted mismatch per declared package — each must be named, and only it —
plus the refused image and the bad inputs. Where verl's source is on disk ($PARITY_VERL_SRC), its real Dockerfile's
text is planted the same way and the nightly's current images are checked against it."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "check_ascend_stack.py"
VERL = Path(os.environ.get("PARITY_VERL_SRC", "/work/verl-main"))
pytestmark = pytest.mark.torch_free


def _module():
    spec = importlib.util.spec_from_file_location("ci_check_ascend_stack", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stack = _module()
COMMIT = "cc7ab9be508ce6ed3637bba9e50367b29b742dc6"

# the shape of verl's Dockerfile.ascend_9.1.0_a2 (its install order and arch branches; written for this test)
CURRENT = f"""# Pull base image
FROM swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:9.1.0-910b-ubuntu22.04-py3.12

RUN ARCH=$(uname -m) && \\
    # Set extra pip index for x86_64 platform
    if [ "$ARCH" = "x86_64" ]; then \\
        pip config set global.extra-index-url "https://download.pytorch.org/whl/cpu/"; \\
    fi && \\
    git clone --depth 1 --branch v0.23.0 https://github.com/vllm-project/vllm.git && \\
    git clone -b releases/v0.23.0 https://github.com/vllm-project/vllm-ascend.git && \\
    git clone https://gitcode.com/Ascend/MindSpeed.git && \\
    cd MindSpeed && git checkout core_r0.16.0 && cd .. && \\
    git clone --depth 1 --branch core_r0.16.0 https://github.com/NVIDIA/Megatron-LM.git && \\

    git clone --depth 1 https://github.com/huggingface/transformers.git && \\
    cd transformers && git fetch --depth 1 origin {COMMIT} && git checkout {COMMIT} && cd ..

RUN ARCH=$(uname -m) && \\
    if [ "$ARCH" = "aarch64" ]; then \\
        export LD_LIBRARY_PATH=/usr/local/Ascend/cann-9.1.0/aarch64-linux/devlib/linux/aarch64:$LD_LIBRARY_PATH; \\
    elif [ "$ARCH" = "x86_64" ]; then \\
        export LD_LIBRARY_PATH=/usr/local/Ascend/cann-9.1.0/x86_64-linux/devlib/linux/x86_64/:$LD_LIBRARY_PATH; \\
    fi && \\
    cd vllm && \\
    VLLM_TARGET_DEVICE=empty pip install -v -e. && cd .. && \\
    if [ "$ARCH" = "x86_64" ]; then \\
        pip install torch==2.10.0+cpu --index-url https://download.pytorch.org/whl/cpu/; \\
    fi && \\
    cd vllm-ascend && pip install -r requirements.txt && \\
    export COMPILE_CUSTOM_KERNELS=1 && pip install --no-build-isolation --no-deps -v -e . && cd .. && \\
    pip install -e MindSpeed && \\
    pip install -e Megatron-LM && \\
    cd transformers && pip install -e . && cd .. && \\
    pip install mbridge

RUN git clone --recursive https://github.com/verl-project/verl.git && \\
    cd verl && pip install -r requirements-npu.txt && pip install -v -e . --no-deps && cd ..
"""
REQUIREMENTS = "numpy\ntorch==2.10.0\ntorch-npu==2.10.0.post4\ntorchvision==0.25.0\ntransformers==5.5.4\n"
BUILD = """name: docker-build-ascend-a2
jobs:
  build-push-digest:
    steps:
      - id: version
        run: |
          echo "tag=latest-vllm-910b-ubuntu" >> "$GITHUB_OUTPUT"
      - uses: docker/build-push-action@v6
        with:
          file: ./docker/ascend/Dockerfile.ascend_9.1.0_a2
          tags: quay.io/ascend/verl:tmp-a2-amd64
  merge-image:
    needs: build-push-digest
    steps:
      - run: docker buildx imagetools create -t "$IMAGE:${{ needs.build-push-digest.outputs.tag }}" $DIGESTS
  build-push-digest-v080:
    steps:
      - uses: docker/build-push-action@v6
        with:
          file: ./docker/ascend/Dockerfile.ascend_9.0.0_a2_v0.8.0
  merge-image-v080:
    needs: build-push-digest-v080
    steps:
      - run: |
          docker buildx imagetools create \\
            -t "$IMAGE:v0.8.0-cann9.0.0-torch_npu2.9.0.post2-910b-ubuntu22.04-py3.11-vllm" \\
            $DIGESTS
"""
TAGS = """# Supported tags

## Latest Images

| Device | CANN Base Image | Inference Backend | Image Tag | Dockerfile |
|--------|-----------------|-------------------|-----------|------------|
| 910b | 9.0.0 | vLLM | `latest-vllm-910b-ubuntu` | [Dockerfile.ascend_9.1.0_a2](https://x/Dockerfile.ascend_9.1.0_a2) |

## verl Release Images

| Device | CANN Base Image | Inference Backend | verl release version | Image Tag | Dockerfile |
|--------|-----------------|-------------------|----------------------|-----------|------------|
| 910b | 8.5.0 | vLLM | v0.7.1 | `verl-8.5.0-910b-ubuntu22.04-py3.11-v0.7.1` | [Dockerfile.ascend_9.1.0_a2](a) |

## History Images

| Device | CANN Base Image | Inference Backend | Image Tag | Dockerfile |
|--------|-----------------|-------------------|-----------|------------|
| 910b | 8.5.0 | vLLM | `verl-8.5.0-910b-ubuntu22.04-py3.11-latest` | [Dockerfile.ascend_9.1.0_a2](https://x/b) |
"""
REGISTRY = "swr.ap-southeast-1.myhuaweicloud.com/base_image/ascend-ci/verl/verl"


def _nightly(tmp_path: Path, **images: str) -> Path:
    """A workflow whose `pick` step names these defaults (the nightly's form: inputs || vars || 'default')."""
    env = "\n".join(f"          {k}: ${{{{ vars.PARITY_IMAGE_{k} || '{REGISTRY}:{v}' }}}}" for k, v in images.items())
    path = tmp_path / "nightly.yml"
    path.write_text(f"jobs:\n  prepare:\n    steps:\n      - id: pick\n        env:\n{env}\n        run: 'true'\n")
    return path


def _git_repo(path: Path, branches: dict[str, str]) -> Path:
    """A git repository with one branch per entry, each holding requirements.txt."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)
    path.mkdir(parents=True)
    git("init", "-q")
    for branch, requirements in branches.items():
        git("checkout", "-q", "--orphan", branch)
        (path / "requirements.txt").write_text(requirements)
        git("add", "requirements.txt")
        git("commit", "-q", "-m", branch)
    return path


def _verl(tmp_path: Path, dockerfile: str = CURRENT, requirements: str = REQUIREMENTS) -> tuple[Path, dict]:
    verl = tmp_path / "verl"
    (verl / ".github" / "workflows").mkdir(parents=True)
    (verl / "docker" / "ascend").mkdir(parents=True)
    (verl / ".github" / "workflows" / "docker-build-ascend-a2.yml").write_text(BUILD)
    (verl / "docker" / "ascend" / "Dockerfile.ascend_9.1.0_a2").write_text(dockerfile)
    (verl / "docker" / "ascend" / "supported_tags.md").write_text(TAGS)
    (verl / "requirements-npu.txt").write_text("accelerate\n")
    repo = _git_repo(tmp_path / "vllm-ascend", {"releases/v0.23.0": requirements, "releases/v0.24.0": requirements})
    return verl, {"vllm-ascend": repo}


def _check(tmp_path: Path, verl: Path, repos: dict, nightly: Path | None = None, *extra: str):
    nightly = nightly or _nightly(tmp_path, CURRENT_910B="latest-vllm-910b-ubuntu")
    argv = [str(verl), "--nightly", str(nightly), *[f"--repo={k}={v}" for k, v in repos.items()], *extra]
    return stack.main(argv)


def test_every_version_of_the_image_is_read_per_architecture(tmp_path):
    verl, repos = _verl(tmp_path)
    image = stack.facts(verl, _nightly(tmp_path, CURRENT_910B="latest-vllm-910b-ubuntu"), repos)[0]
    x86 = {k: v.value for k, v in image.stack.versions["x86_64"].items()}
    arm = {k: v.value for k, v in image.stack.versions["aarch64"].items()}
    assert x86 == {"python": "3.12", "cann": "9.1.0", "vllm": "v0.23.0", "torch": "2.10.0+cpu",
                   "torch_npu": "2.10.0.post4", "vllm_ascend": "releases/v0.23.0", "mindspeed": "core_r0.16.0",
                   "megatron_lm": "core_r0.16.0", "transformers": COMMIT}
    # aarch64: no torch line in the Dockerfile; vllm-ascend's requirements.txt pins it
    assert arm == {**x86, "torch": "2.10.0"}
    assert "vllm-ascend releases/v0.23.0 requirements.txt" in image.stack.versions["aarch64"]["torch"].source


def test_the_clean_image_passes(tmp_path, capsys):
    verl, repos = _verl(tmp_path)
    assert _check(tmp_path, verl, repos) == 0
    out = capsys.readouterr().out
    assert "::error" not in out and "| CURRENT_910B | `latest-vllm-910b-ubuntu` |" in out


# each declared package, planted: (the edit of the Dockerfile or of vllm-ascend's requirements, the package, arches)
PLANTED = {
    "python": ("-py3.12", "-py3.13", None, "python 3.13", ("x86_64", "aarch64")),
    "cann": ("cann:9.1.0-", "cann:9.2.0-", None, "cann 9.2.0", ("x86_64", "aarch64")),
    "torch x86_64": ("pip install -e MindSpeed", 'if [ "$ARCH" = "x86_64" ]; then pip install torch==2.11.0+cpu; '
                     "fi && pip install -e MindSpeed", None, "torch 2.11.0+cpu", ("x86_64",)),
    "torch aarch64": ("pip install -e MindSpeed", 'if [ "$ARCH" = "aarch64" ]; then pip install torch==2.11.0; '
                      "fi && pip install -e MindSpeed", None, "torch 2.11.0", ("aarch64",)),
    # pip reinstalls the x86_64 torch too: `torch==2.11.0` is not satisfied by 2.10.0+cpu
    "torch via vllm-ascend": (None, None, ("torch==2.10.0", "torch==2.11.0"), "torch 2.11.0", ("x86_64", "aarch64")),
    "torch_npu": (None, None, ("torch-npu==2.10.0.post4", "torch-npu==2.11.0"), "torch_npu 2.11.0",
                  ("x86_64", "aarch64")),
    "transformers": (COMMIT, "0123456789abcdef0123456789abcdef01234567", None, "transformers 0123456789",
                     ("x86_64", "aarch64")),
    "transformers release": ("cd transformers && pip install -e . && cd ..", "pip install transformers==5.24.0",
                             None, "transformers 5.24.0", ("x86_64", "aarch64")),
    "mindspeed": ("git checkout core_r0.16.0", "git checkout core_r0.17.0", None, "mindspeed core_r0.17.0",
                  ("x86_64", "aarch64")),
    "megatron_lm": ("--branch core_r0.16.0 https://github.com/NVIDIA/Megatron-LM",
                 "--branch core_r0.17.1 https://github.com/NVIDIA/Megatron-LM", None, "megatron_lm core_r0.17.1",
                 ("x86_64", "aarch64")),
    "vllm": ("--branch v0.23.0 https://github.com/vllm-project/vllm.git",
             "--branch v0.24.0 https://github.com/vllm-project/vllm.git", None, "vllm v0.24.0",
             ("x86_64", "aarch64")),
    "vllm_ascend": ("-b releases/v0.23.0", "-b releases/v0.24.0", None, "vllm_ascend releases/v0.24.0",
                    ("x86_64", "aarch64")),
}


def _plant(dockerfile: str, requirements: str, planted: tuple) -> tuple[str, str]:
    old, new, pin, _, _ = planted
    if old is not None:
        if old not in dockerfile:
            pytest.skip(f"the Dockerfile no longer has {old!r} to plant the mismatch at")
        dockerfile = dockerfile.replace(old, new)
    if pin is not None:
        requirements = requirements.replace(*pin)
    return dockerfile, requirements


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_mismatch_of_each_declared_package_is_named(tmp_path, capsys, name):
    dockerfile, requirements = _plant(CURRENT, REQUIREMENTS, PLANTED[name])
    verl, repos = _verl(tmp_path, dockerfile, requirements)
    assert _check(tmp_path, verl, repos) == 3
    drift = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::error")]
    package_value, arches = PLANTED[name][3], PLANTED[name][4]
    assert drift and all("Ascend stack drift" in line for line in drift), drift
    named = [line for line in drift if f" {package_value}" in line]
    assert named and all(a in named[0] for a in arches), drift
    package = package_value.split()[0]
    assert all(f" {package} " in line for line in drift), drift  # that package only
    if arches == ("x86_64",):
        assert "aarch64" not in named[0]
    if arches == ("aarch64",):
        assert "x86_64" not in named[0].rsplit("[", 1)[-1]


def test_an_unread_requirements_file_is_drift_that_says_what_to_pass(tmp_path, capsys):
    verl, _ = _verl(tmp_path)
    assert _check(tmp_path, verl, {}) == 3
    out = capsys.readouterr().out
    assert "torch is not declared by Dockerfile.ascend_9.1.0_a2" in out and "[aarch64]" in out
    assert "pass --repo vllm-ascend=GIT_DIR" in out


def test_an_image_verl_no_longer_builds_is_refused_naming_what_it_builds_now(tmp_path, capsys):
    verl, repos = _verl(tmp_path)
    nightly = _nightly(tmp_path, CURRENT_910B="latest-vllm-910b-ubuntu",
                       CORE012_910B="verl-8.5.0-910b-ubuntu22.04-py3.11-latest")
    assert _check(tmp_path, verl, repos, nightly) == 1
    refused = [line for line in capsys.readouterr().out.splitlines() if "Ascend image refused" in line]
    assert len(refused) == 1, refused
    assert refused[0].split("::")[2].startswith(f"CORE012_910B: {REGISTRY}:verl-8.5.0-910b-ubuntu22.04-py3.11-latest")
    assert "only under 'History Images'" in refused[0]
    assert "verl builds now: `latest-vllm-910b-ubuntu` (Dockerfile.ascend_9.1.0_a2)" in refused[0]


def test_a_frozen_release_image_is_not_refused(tmp_path, capsys):
    """The clean twin of the refusal: listed under "verl Release Images", built once, never rebuilt."""
    verl, repos = _verl(tmp_path)
    nightly = _nightly(tmp_path, CURRENT_910B="verl-8.5.0-910b-ubuntu22.04-py3.11-v0.7.1")
    assert _check(tmp_path, verl, repos, nightly) == 0
    assert "no (verl Release Images: frozen)" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["no pick step", "no stack for the variable", "malformed stacks", "unknown source",
                                 "not verl", "bad --repo", "unsplittable RUN"])
def test_bad_input_is_exit_2_without_a_traceback(tmp_path, capsys, bad):
    verl, repos = _verl(tmp_path)
    nightly = _nightly(tmp_path, CURRENT_910B="latest-vllm-910b-ubuntu")
    extra: list[str] = []
    if bad == "no pick step":
        nightly.write_text(nightly.read_text().replace("id: pick", "id: other"))
    elif bad == "no stack for the variable":
        nightly = _nightly(tmp_path, NEW_910B="latest-vllm-910b-ubuntu")
    elif bad in ("malformed stacks", "unknown source"):
        stacks = tmp_path / "stacks.yaml"
        text = (ROOT / "ci" / "ascend_stacks.yaml").read_text()
        stacks.write_text("stacks: [" if bad == "malformed stacks" else text.replace("{from: wheelhouse}",
                                                                                        "{from: elsewhere}", 1))
        extra = ["--stacks", str(stacks)]
    elif bad == "not verl":
        verl = tmp_path
    elif bad == "bad --repo":
        repos = {"vllm-ascend": tmp_path / "missing"}
    elif bad == "unsplittable RUN":
        (verl / "docker" / "ascend" / "Dockerfile.ascend_9.1.0_a2").write_text(CURRENT + 'RUN echo "open\n')
    assert _check(tmp_path, verl, repos, nightly, *extra) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    assert captured.err.strip()


def test_the_image_s_versions_as_shell_assignments(tmp_path, capsys):
    """What ci/image_stack.sh installs: the image's pins, a transformers commit as its declared version's release."""
    verl, repos = _verl(tmp_path)
    assert _check(tmp_path, verl, repos, None, "--image", "CURRENT_910B") == 0
    env = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    env = {k: shlex.split(v)[0] for k, v in env.items()}
    assert (env["PYTHON"], env["TORCH"], env["MEGATRON_CORE"], env["MINDSPEED"]) == \
        ("3.12", "2.10.0", "0.16.0", "core_r0.16.0")
    assert (env["TRANSFORMERS"], env["TRANSFORMERS_COMMIT"], env["TRANSFORMERS_COMMIT_VERSION"]) == \
        ("5.3.0", COMMIT, "5.3.0.dev0")


def test_the_declared_stacks_resolve_from_the_files_that_state_them():
    stacks = stack.declared_stacks()
    current = stacks["CURRENT_910B"]
    assert current["torch_npu"][0].values == ("2.10.0",)  # the emulated torch_npu's __version__
    assert "3.12" in current["python"][0].values  # ci/wheelhouse.sh builds for it
    megatron = {e.source.split(" (")[0]: e.values for e in current["megatron_lm"]}
    assert megatron == {"MindSpeed core_r0.16.0 pairs with it": ("0.16.0",),
                        "the emulated lane's megatron-core for core_r0.16.0": ("0.16.1",)}
    assert {e.values for e in stacks["CORE012_910B"]["megatron_lm"]} == {("0.12.1",)}


# --- verl's real Dockerfile ---------------------------------------------------------------------------------------

REAL = VERL / "docker" / "ascend" / "Dockerfile.ascend_9.1.0_a2"


@pytest.mark.skipif(not REAL.is_file(), reason=f"no verl checkout at {VERL} ($PARITY_VERL_SRC)")
@pytest.mark.parametrize("name", ["clean", *PLANTED])
def test_verl_s_real_dockerfile_text_clean_and_planted(tmp_path, capsys, name):
    dockerfile, requirements = REAL.read_text(), REQUIREMENTS
    if name != "clean":
        dockerfile, requirements = _plant(dockerfile, requirements, PLANTED[name])
    verl, repos = _verl(tmp_path, dockerfile, requirements)
    rc = _check(tmp_path, verl, repos)
    drift = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::error")]
    expected = (0, False) if name == "clean" else (3, True)
    named = name != "clean" and any(f" {PLANTED[name][3]}" in line for line in drift)
    assert (rc, named) == expected, drift


@pytest.mark.skipif(not REAL.is_file(), reason=f"no verl checkout at {VERL} ($PARITY_VERL_SRC)")
def test_the_nightly_s_current_images_are_the_ones_verl_builds():
    images = {i.variable: i for i in stack.facts(VERL)}
    for variable in ("CURRENT_910B", "CURRENT_A3"):
        image = images[variable]
        assert image.built and not image.refusal, image
        assert image.stack.versions["aarch64"]["mindspeed"].value == "core_r0.16.0", image
