"""The machines a rehearsal runs jobs on: clean CPythons (what actions/setup-python and a fresh image start from),
the "images" of the Ascend lanes (a clean CPython with the image's stack installed and the emulated torch_npu on its
path), and the stand-ins for GitHub's services a step calls by command (`gh release`, `git clone` of a public
repository): small scripts on the job's PATH that use the rehearsal's local stores and refuse everything else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "emulated_npu" / "site"
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
#: where actions/setup-python keeps its CPythons on a GitHub-hosted runner (the nightly's rehearsal job)
TOOLCACHE = Path(os.environ.get("RUNNER_TOOL_CACHE", "/opt/hostedtoolcache")) / "Python"
#: runner-set name -> its cards (verl's Ascend runner sets name their one node's card count last)
_CARDS = re.compile(r"-(\d+)$")


def cards_of(label: str) -> int:
    found = _CARDS.search(label)
    return int(found.group(1)) if found else 0


def base_python(version: str) -> Path:
    """The pyenv CPython of a `3.11`-style version (the newest patch release here)."""
    found = [*PYENV.glob(f"{version}.*"), *(p / "x64" for p in TOOLCACHE.glob(f"{version}.*"))]
    candidates = sorted((p for p in found if (p / "bin" / f"python{version}").is_file()),
                        key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()] or
                        [int(x) for x in p.parent.name.split(".") if x.isdigit()])
    if not candidates:
        raise FileNotFoundError(f"no CPython {version} under {PYENV} or {TOOLCACHE} (pyenv install {version}, or "
                                f"actions/setup-python with {version})")
    return candidates[-1]


def clean_python(version: str, target: Path) -> Path:
    """A CPython of `version` at `target` holding nothing but pip and setuptools, as a fresh setup-python or a
    Dockerfile's first layer gives: the interpreter and standard library of the pyenv build (hard links), its
    site-packages left behind. Returns its bin/."""
    if (target / "bin" / "python3").exists():
        return target / "bin"
    source = base_python(version)
    (target / "bin").mkdir(parents=True)
    (target / "lib").mkdir()
    shutil.copy2(source / "bin" / f"python{version}", target / "bin" / f"python{version}")
    for alias in ("python3", "python"):
        (target / "bin" / alias).symlink_to(f"python{version}")
    stdlib_source = source / "lib" / f"python{version}"
    # hard links where the two folders share a file system; a copy where they do not
    if subprocess.run(["cp", "-al", str(stdlib_source), str(target / "lib")], capture_output=True).returncode:
        shutil.rmtree(target / "lib" / f"python{version}", ignore_errors=True)
        shutil.copytree(stdlib_source, target / "lib" / f"python{version}", symlinks=True,
                        ignore=shutil.ignore_patterns("site-packages", "test"))
    for library in (source / "lib").glob("libpython*"):  # a shared build finds it beside its prefix, or by rpath
        if not (target / "lib" / library.name).exists():
            (target / "lib" / library.name).symlink_to(library)
    stdlib = target / "lib" / f"python{version}"
    for heavy in ("site-packages", "test"):
        shutil.rmtree(stdlib / heavy, ignore_errors=True)
    (stdlib / "site-packages").mkdir()
    python = target / "bin" / "python3"
    subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], check=True, capture_output=True,
                   env={**os.environ, "PIP_NO_INDEX": "1"})
    return target / "bin"


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """What a rehearsal image carries: the stack an Ascend image of verl's brings (torch, transformers, Megatron,
    MindSpeed) on CPU, with the emulated torch_npu in place of the real one."""

    name: str
    python: str
    constraints: str
    """The repo's constraints file whose pins the image installs (ci/constraints-*.txt)."""
    packages: tuple[str, ...]
    mindspeed: Path | None = None


def build_image(spec: ImageSpec, root: Path) -> Path:
    """Build (once) the image's Python under `root/<name>`; returns its bin/. The build reaches the package
    registry, as `docker build` does; the steps run inside it later reach none."""
    target = root / spec.name
    done = target / ".built"
    if done.is_file() and done.read_text() == repr(spec):
        return target / "bin"
    shutil.rmtree(target, ignore_errors=True)
    bin_dir = clean_python(spec.python, target)
    python = str(bin_dir / "python3")
    uv = shutil.which("uv") or "uv"
    links = []
    for found in subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True,
                                text=True, check=False).stdout.split():
        links += ["--find-links", found]
    subprocess.run([uv, "pip", "install", "--python", python, "-r", str(ROOT / "ci" / "torch.txt"), *links],
                   check=True)
    subprocess.run([uv, "pip", "install", "--python", python, *spec.packages, "-c", str(ROOT / spec.constraints)],
                   check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    paths = [str(SITE)] + ([str(spec.mindspeed)] if spec.mindspeed else [])
    # the image's own packages (Ascend images install MindSpeed and Megatron-LM as source trees on the path)
    Path(site, "rehearsal-image.pth").write_text("\n".join(paths) + "\n")
    done.write_text(repr(spec))
    return bin_dir


GH = '''\
#!{python}
"""gh, as the rehearsal has it: releases live in {releases}; nothing else of GitHub's API is here."""
import shutil, sys, fnmatch
from pathlib import Path
store = Path({releases!r})
args = sys.argv[1:]
def opt(name, default=None):
    if name in args:
        i = args.index(name); value = args[i + 1]; del args[i:i + 2]; return value
    return default
repo, pattern, folder = opt("--repo"), opt("--pattern", "*"), opt("--dir", ".")
opt("--title"); opt("--notes")
if args[:2] == ["release", "create"]:
    tag, files = args[2], args[3:]
    if (store / tag).exists():
        sys.exit(f"gh: release {{tag}} already exists")
    (store / tag).mkdir(parents=True)
    for f in files:
        shutil.copy2(f, store / tag / Path(f).name)
    print(f"rehearsal release {{tag}}: {{', '.join(files)}}")
elif args[:2] == ["release", "download"]:
    tag = args[2]
    if not (store / tag).is_dir():
        sys.exit(f"gh: release not found: {{tag}}")
    got = [p for p in (store / tag).iterdir() if fnmatch.fnmatch(p.name, pattern)]
    if not got:
        sys.exit(f"gh: no assets match {{pattern}} in {{tag}}")
    Path(folder).mkdir(parents=True, exist_ok=True)
    for p in got:
        shutil.copy2(p, Path(folder) / p.name)
else:
    sys.exit("gh " + " ".join(sys.argv[1:]) + ": not available in the rehearsal (no GitHub API here)")
'''

GIT = '''\
#!/bin/sh
# git, as the rehearsal has it: `git clone` of a GitHub repository copies the local tree standing in for it
# ({sources}); every other git command is the real one.
if [ "$1" = clone ]; then
  exec {python} - "$@" <<'PY'
import json, shutil, sys
sources = json.loads({sources_json!r})
args = [a for a in sys.argv[2:] if not a.startswith("-")]
url = next((a for a in args if "github.com/" in a), None)
if url is None:
    sys.exit("git clone: the rehearsal reaches no network: " + " ".join(sys.argv[1:]))
name = url.split("github.com/", 1)[1].removesuffix(".git").strip("/")
if name not in sources:
    sys.exit(f"git clone {{url}}: no local tree for {{name}} (--source {{name}}=DIR)")
dest = args[args.index(url) + 1] if args.index(url) + 1 < len(args) else name.rsplit("/", 1)[1]
shutil.copytree(sources[name], dest, symlinks=True)
print(f"rehearsal: {{name}} copied from {{sources[name]}}")
PY
fi
exec {git} "$@"
'''


def service_stubs(folder: Path, releases: Path, sources: dict[str, Path]) -> Path:
    """A folder with `gh` and `git` for a job's PATH."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    releases.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    (folder / "gh").write_text(GH.format(python=python, releases=str(releases)))
    git = shutil.which("git") or "/usr/bin/git"
    as_json = json.dumps({k: str(v) for k, v in sources.items()})
    (folder / "git").write_text(textwrap.dedent(GIT).format(python=python, sources=", ".join(sources) or "none",
                                                            sources_json=as_json, git=git))
    for script in ("gh", "git"):
        (folder / script).chmod(0o755)
    return folder
