#!/usr/bin/env python3
"""The Ascend images the nightly names, against verl's own image builds and the stacks this harness declares.

    python ci/check_ascend_stack.py VERL_DIR [--repo NAME=GIT_DIR ...] [--nightly WORKFLOW] [--stacks YAML]
    python ci/check_ascend_stack.py VERL_DIR [--repo ...] --image VARIABLE [--arch ARCH]   # for ci/image_stack.sh

VERL_DIR is a checkout of verl-project/verl; `--repo vllm-ascend=GIT_DIR` a clone (bare or not) of a repository a
Dockerfile clones and installs requirements from: verl's Ascend Dockerfiles pin torch only on x86_64, so the aarch64
torch (the runners' one) and torch_npu are what vllm-ascend's requirements.txt pins at the branch the Dockerfile
clones.

The nightly states each default image once (.github/workflows/nightly.yml, the step `id: pick`: its env maps a
variable to `${{ ... || '<default image>' }}`; `nightly_images` reads it). For each, this finds the Dockerfile verl
builds it from (the tag a docker-build-ascend-*.yml job pushes, else docker/ascend/supported_tags.md), reads every
version that Dockerfile declares per architecture (`dockerfile_stack`: Python and CANN from the base image, torch,
torch_npu, transformers, MindSpeed, Megatron-LM, vllm, vllm-ascend, replaying its installs in order) and compares
each with the stack ci/ascend_stacks.yaml declares for that variable.

Exit: 0 clean; 1 a default image REFUSED — verl's build workflows no longer build it (only under "History Images",
or nowhere) — naming the variable, the image and the tag verl builds now; 2 cannot check (usage, a file missing or
malformed, a variable no stack names); 3 drift: a version the image declares differs from the declared stack, or
could not be read. With `--image`, prints the image's versions as shell assignments (exit 0, or 2 / 3 as above).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NIGHTLY = ROOT / ".github" / "workflows" / "nightly.yml"
STACKS = ROOT / "ci" / "ascend_stacks.yaml"
EMULATED = ROOT / "tests" / "emulated_npu" / "site" / "torch_npu" / "__init__.py"
WHEELHOUSE = ROOT / "ci" / "wheelhouse.sh"
EMULATED_LANE = ROOT / ".github" / "workflows" / "emulated-npu.yml"
BRANCHES = ROOT / "tests" / "data" / "mindspeed_branches"
MINDSPEED_ENV = ROOT / "engines" / "mindspeed" / "env.py"

ARCHES = ("x86_64", "aarch64")
#: what a stack declares, in the order of the facts table
PACKAGES = ("python", "cann", "torch", "torch_npu", "transformers", "mindspeed", "megatron_lm", "vllm", "vllm_ascend")
#: pip's (normalised) names -> the stack's
PIP_NAMES = {"torch": "torch", "torch-npu": "torch_npu", "transformers": "transformers", "vllm": "vllm",
             "vllm-ascend": "vllm_ascend", "megatron-core": "megatron_lm", "mindspeed": "mindspeed"}
#: a cloned repository (its URL's last part, lower case) installed from source -> the package it is
REPO_NAMES = {"vllm": "vllm", "vllm-ascend": "vllm_ascend", "mindspeed": "mindspeed", "megatron-lm": "megatron_lm",
              "transformers": "transformers"}
HISTORY = "History Images"

_LITERAL = re.compile(r"'([^']+)'\s*\}\}\s*$")
_SECTION = re.compile(r"^##\s+(.+?)\s*$")
_TAG_OUTPUT = re.compile(r"\btag=([\w.-]+)")
_PUSH_TAG = re.compile(r"""-t\s+["']?[^"'\s]*:([\w.-]+)["']?""")
_BASE = re.compile(r"^FROM\s+(?:--\S+\s+)*(\S+)", re.I | re.M)
_PYTHON = re.compile(r"py(\d+\.\d+)")
_EMULATED_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"+]+)""", re.M)
_WHEELHOUSE_PYTHONS = re.compile(r"^pythons=\(([\d. ]+)\)", re.M)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*(?:;.*)?$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_RELEASE = re.compile(r"(\d+(?:\.[0-9A-Za-z]+)+)")
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}


class StackError(Exception):
    """Bad input: what cannot be checked, and why (exit 2)."""


@dataclass(frozen=True)
class Found:
    """One version an image declares, and where it was read."""

    value: str
    """As the Dockerfile states it: '2.10.0+cpu', 'core_r0.16.0', 'releases/v0.23.0', a commit, '3.12'."""
    source: str
    """'Dockerfile.ascend_9.1.0_a2: pip install torch==2.10.0+cpu' and the like."""


@dataclass
class ImageStack:
    """What one Dockerfile installs, per architecture; `unread`: requirement files it installs that were not read."""

    dockerfile: str
    versions: dict[str, dict[str, Found]] = field(default_factory=lambda: {a: {} for a in ARCHES})
    unread: dict[str, list[str]] = field(default_factory=lambda: {a: [] for a in ARCHES})


@dataclass(frozen=True)
class Expected:
    """A declared value for one package of a stack, and the file that declares it."""

    values: tuple[str, ...]
    """Any one of them is accepted (the wheelhouse's Pythons); otherwise one value."""
    source: str
    by_minor: bool = False
    commit_version: str | None = None
    """A transformers commit's version as its tree states it (5.3.0.dev0): no package index serves a commit."""


@dataclass
class Image:
    variable: str
    image: str
    tag: str
    dockerfile: str | None
    built: bool
    listed_in: tuple[str, ...]
    stack: ImageStack | None
    refusal: str | None = None


# --- the nightly ------------------------------------------------------------------------------------------------


def nightly_images(nightly: Path = NIGHTLY) -> dict[str, str]:
    """The default image of each variable of the step `id: pick` (any job): the literal after the last `||`, or the
    whole value when it is a literal. The one function the nightly's layout is read through."""
    try:
        jobs = (yaml.safe_load(nightly.read_text()) or {}).get("jobs") or {}
    except (OSError, yaml.YAMLError) as error:
        raise StackError(f"{nightly}: {error}") from None
    for job in jobs.values():
        for step in (job or {}).get("steps") or []:
            if isinstance(step, dict) and step.get("id") == "pick":
                images = {}
                for variable, value in (step.get("env") or {}).items():
                    text = str(value)
                    if found := _LITERAL.search(text):
                        images[variable] = found.group(1)
                    elif "${{" not in text:
                        images[variable] = text
                if images:
                    return images
    raise StackError(f"{nightly}: no step `id: pick` with default images in its env")


# --- verl's builds ----------------------------------------------------------------------------------------------


def verl_builds(verl: Path) -> dict[str, str]:
    """Tag -> Dockerfile for every image verl's Ascend build workflows push: per job that builds a `file:`, the tags
    it writes as its `tag=` output and the literal `-t ...:TAG` of the jobs that need it (the multi-arch merge)."""
    built: dict[str, str] = {}
    for workflow in sorted((verl / ".github" / "workflows").glob("docker-build-ascend-*.yml")):
        try:
            jobs = (yaml.safe_load(workflow.read_text()) or {}).get("jobs") or {}
        except yaml.YAMLError as error:
            raise StackError(f"{workflow}: {error}") from None
        for name, job in jobs.items():
            steps = [s for s in (job or {}).get("steps") or [] if isinstance(s, dict)]
            files = [Path(str((s.get("with") or {})["file"])).name for s in steps if "file" in (s.get("with") or {})]
            if not files:
                continue
            tags = [t for s in steps for t in _TAG_OUTPUT.findall(str(s.get("run", "")))]
            for other in jobs.values():
                needs = (other or {}).get("needs") or []
                if name in ([needs] if isinstance(needs, str) else needs):
                    tags += [t for s in other.get("steps") or [] if isinstance(s, dict)
                             for t in _PUSH_TAG.findall(str(s.get("run", "")))]
            for tag in dict.fromkeys(tags):
                if not tag.startswith("tmp-"):
                    built[tag] = files[0]
    return built


@dataclass(frozen=True)
class TagRow:
    section: str
    device: str
    backend: str
    tag: str
    dockerfile: str


def supported_tags(verl: Path) -> list[TagRow]:
    """The rows of docker/ascend/supported_tags.md, with the section ("Latest Images", "History Images", ...)."""
    table = verl / "docker" / "ascend" / "supported_tags.md"
    if not table.is_file():
        return []
    rows, section, header = [], "", []
    for line in table.read_text().splitlines():
        if heading := _SECTION.match(line):
            section, header = heading.group(1), []
        elif line.startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not header:
                header = [c.lower() for c in cells]
                continue
            cell = dict(zip(header, cells))
            tag = re.search(r"`([^`]+)`", cell.get("image tag", ""))
            dockerfile = re.search(r"\[(Dockerfile[^\]]*)\]", cell.get("dockerfile", ""))
            if tag:
                rows.append(TagRow(section, cell.get("device", ""), cell.get("inference backend", ""), tag.group(1),
                                   dockerfile.group(1) if dockerfile else ""))
    return rows


def _built_now(row: TagRow | None, built: dict[str, str], rows: list[TagRow]) -> str:
    """The tags verl builds now for the refused image's chip and backend (else every tag it builds)."""
    same = [r.tag for r in rows if row and r.tag in built and r.device.lower() == row.device.lower()
            and r.backend.lower() == row.backend.lower()]
    tags = list(dict.fromkeys(same)) or sorted(built)
    return ", ".join(f"`{t}` ({built[t]})" for t in tags) or "none"


# --- a Dockerfile, replayed -------------------------------------------------------------------------------------


def _instructions(text: str) -> list[str]:
    """Logical Dockerfile lines: continuations joined, and the comment and empty lines Docker drops inside them."""
    out: list[str] = []
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current = (current or "") + (line[:-1] + " " if line.endswith("\\") else line)
        if not line.endswith("\\"):
            out.append(current)
            current = None
    if current:
        out.append(current)
    return out


def _commands(body: str) -> list[list[str]]:
    lexer = shlex.shlex(body, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS:
                commands.append([])
            else:
                commands[-1].append(token)
    except ValueError as error:
        raise StackError(f"cannot split a RUN instruction ({error}): {body[:80]}...") from None
    return [c for c in commands if c]


def _arch_condition(tokens: list[str]) -> set[str]:
    """`[ "$ARCH" = "x86_64" ]` -> {'x86_64'}; any other test -> every architecture."""
    words = [t for t in tokens if t not in ("[", "]", "[[", "]]")]
    if len(words) == 3 and words[0] in ("$ARCH", "${ARCH}") and words[1] in ("=", "==") and words[2] in ARCHES:
        return {words[2]}
    return set(ARCHES)


def _public(version: str) -> str:
    return version.split("+", 1)[0]


@dataclass
class _Clone:
    repo: str
    ref: str | None


class _Replay:
    """Replays a Dockerfile's RUN instructions: clones, `cd`, `git checkout`, `pip install` — per architecture
    (the `if [ "$ARCH" = ... ]` blocks), the last install of a package winning as it does in the image."""

    def __init__(self, name: str, repos: dict[str, Path]):
        self.stack = ImageStack(name)
        self.repos = repos
        self.clones: dict[str, _Clone] = {}
        self.cwd: str | None = None
        self.scopes: list[tuple[set[str], set[str]]] = []  # (this branch's arches, arches an earlier branch took)

    def arches(self) -> set[str]:
        active = set(ARCHES)
        for branch, _ in self.scopes:
            active &= branch
        return active

    def set(self, package: str, found: Found, pinned: bool) -> None:
        for arch in self.arches():
            have = self.stack.versions[arch].get(package)
            # `pip install torch==2.10.0` over 2.10.0+cpu: already satisfied (PEP 440 ignores the local label)
            if pinned and have and _public(have.value) == _public(found.value):
                continue
            self.stack.versions[arch][package] = found

    def run(self, tokens: list[str]) -> None:
        while tokens and tokens[0] in ("then", "else", "do", "elif", "if", "fi"):
            word, tokens = tokens[0], tokens[1:]
            if word == "if":
                chosen = _arch_condition(tokens)
                self.scopes.append((chosen, set(chosen)))
                return
            if word == "elif" and self.scopes:
                chosen = _arch_condition(tokens) - self.scopes[-1][1]
                self.scopes[-1] = (chosen, self.scopes[-1][1] | chosen)
                return
            if word == "else" and self.scopes:
                self.scopes[-1] = (set(ARCHES) - self.scopes[-1][1], set(ARCHES))
            if word == "fi" and self.scopes:
                self.scopes.pop()
        while tokens and re.match(r"^[A-Za-z_]\w*=", tokens[0]):  # VLLM_TARGET_DEVICE=empty pip install ...
            tokens = tokens[1:]
        if not tokens:
            return
        if tokens[0] == "cd" and len(tokens) > 1:
            self.cwd = None if tokens[1] in ("..", "/", "~", "-") else tokens[1].rstrip("/").rsplit("/", 1)[-1]
        elif tokens[:2] == ["git", "clone"]:
            self.clone(tokens[2:])
        elif tokens[:2] == ["git", "checkout"] and self.cwd in self.clones:
            refs = [t for t in tokens[2:] if not t.startswith("-")]
            if refs:
                self.clones[self.cwd].ref = refs[0]
        elif tokens[0] in ("pip", "pip3") and tokens[1:2] == ["install"]:
            self.pip(tokens[2:])
        elif tokens[0].startswith("python") and tokens[1:4] == ["-m", "pip", "install"]:
            self.pip(tokens[4:])

    def clone(self, args: list[str]) -> None:
        ref, positional, i = None, [], 0
        while i < len(args):
            if args[i] in ("--branch", "-b"):
                ref, i = args[i + 1] if i + 1 < len(args) else None, i + 2
            elif args[i] in ("--depth", "--filter", "-o", "--origin", "-c", "--config"):
                i += 2
            elif args[i].startswith("-"):
                i += 1
            else:
                positional.append(args[i])
                i += 1
        if positional:
            repo = positional[0].rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
            self.clones[positional[1] if len(positional) > 1 else repo] = _Clone(repo, ref)

    def pip(self, args: list[str]) -> None:
        i, name = 0, self.stack.dockerfile
        while i < len(args):
            arg = args[i]
            if arg in ("-r", "--requirement") and i + 1 < len(args):
                self.requirements(args[i + 1])
                i += 2
                continue
            if arg in ("-e", "--editable") and i + 1 < len(args):
                self.source(args[i + 1])
                i += 2
                continue
            if arg.startswith("-e") and len(arg) > 2:
                self.source(arg[2:])
            elif arg.startswith("-r") and len(arg) > 2:
                self.requirements(arg[2:])
            elif arg in ("-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-f", "--find-links",
                         "--trusted-host", "-t", "--target", "--prefix", "--root", "--platform"):
                i += 1
            elif not arg.startswith("-"):
                if (pin := _PIN.match(arg)) and (package := PIP_NAMES.get(_normalise(pin.group(1)))):
                    self.set(package, Found(pin.group(3), f"{name}: pip install {arg}"), pinned=True)
                elif "git+" in arg or arg == "." or arg.startswith("./") or arg in self.clones:
                    self.source(arg)
            i += 1

    def source(self, where: str) -> None:
        """`pip install -e DIR` of a clone, or `pip install git+URL@REF`: that repository at its ref."""
        url = where.split("git+", 1)[-1] if "git+" in where else None
        if url:
            repo, _, ref = url.partition("@")
            clone = _Clone(repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"), ref or None)
        else:
            clone = self.clones.get(self.cwd if where in (".", "./") else where.rstrip("/").rsplit("/", 1)[-1])
        if clone and (package := REPO_NAMES.get(clone.repo.lower())):
            ref = clone.ref or "its default branch"
            self.set(package, Found(ref, f"{self.stack.dockerfile}: {clone.repo} at {ref}"), pinned=False)

    def requirements(self, path: str) -> None:
        clone = self.clones.get(self.cwd or "")
        if clone is None:
            return
        text = _read_repo(self.repos.get(clone.repo) or self.repos.get(self.cwd or ""), clone.ref, path)
        where = f"{clone.repo} {clone.ref or 'default branch'} {path}"
        if text is None:
            for arch in self.arches():
                self.stack.unread[arch].append(f"{where} (pass --repo {clone.repo}=GIT_DIR)")
            return
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if (pin := _PIN.match(line)) and (package := PIP_NAMES.get(_normalise(pin.group(1)))):
                self.set(package, Found(pin.group(3), f"{where} (installed by {self.stack.dockerfile})"),
                         pinned=True)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _read_repo(git_dir: Path | None, ref: str | None, path: str) -> str | None:
    if git_dir is None:
        return None
    if ref is None and (git_dir / path).is_file():  # the default branch, checked out (or extracted) there
        return (git_dir / path).read_text()
    for candidate in ([ref, f"origin/{ref}", f"refs/tags/{ref}"] if ref else ["HEAD"]):
        done = subprocess.run(["git", "-C", str(git_dir), "show", f"{candidate}:{path}"], capture_output=True,
                              text=True, check=False)
        if done.returncode == 0:
            return done.stdout
    return None


def dockerfile_stack(text: str, name: str, repos: dict[str, Path] | None = None) -> ImageStack:
    """Every version a Dockerfile declares, per architecture (see the module's docstring)."""
    replay = _Replay(name, repos or {})
    if base := _BASE.search(text):
        image = base.group(1)
        tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
        if python := _PYTHON.search(tag):
            replay.set("python", Found(python.group(1), f"{name}: FROM {image}"), pinned=False)
        if "cann" in image.rsplit("/", 1)[-1] and tag:
            replay.set("cann", Found(tag.split("-", 1)[0], f"{name}: FROM {image}"), pinned=False)
    for line in _instructions(text):
        if line.split(None, 1)[0].upper() == "RUN" and " " in line:
            replay.cwd = None  # every RUN starts in the WORKDIR
            for tokens in _commands(line.split(None, 1)[1]):
                replay.run(tokens)
    return replay.stack


# --- the declared stacks ----------------------------------------------------------------------------------------


def _load(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as error:
        raise StackError(f"{what}: {error}") from None


def _mindspeed_env():
    """engines/mindspeed/env.py by path: standard library only, so this script needs no install of the harness."""
    spec = importlib.util.spec_from_file_location("_parity_mindspeed_env", MINDSPEED_ENV)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _from(source: str, stack: dict, where: str) -> Expected:
    if source == "wheelhouse":
        found = _WHEELHOUSE_PYTHONS.search(_load(WHEELHOUSE, where))
        if not found:
            raise StackError(f"{where}: {WHEELHOUSE.relative_to(ROOT)} has no `pythons=(...)` line")
        return Expected(tuple(found.group(1).split()), f"{WHEELHOUSE.relative_to(ROOT)} (the wheelhouse's Pythons)")
    if source == "emulated-torch_npu":
        found = _EMULATED_VERSION.search(_load(EMULATED, where))
        if not found:
            raise StackError(f"{where}: {EMULATED.relative_to(ROOT)} has no __version__")
        return Expected((found.group(1),), f"{EMULATED.relative_to(ROOT)} __version__")
    branch = str(stack.get("mindspeed", ""))
    if source == "mindspeed-pairing":
        data = BRANCHES / branch
        readme = data / "README.md"
        if not readme.is_file():
            raise StackError(f"{where}: no {readme.relative_to(ROOT)} (python -m tests.emulated_npu."
                             "mindspeed_pairings extract)")
        setup = data / "setup.py"
        env = _mindspeed_env()
        pairing = env.declared_pairing(readme.read_text(), env._setup_version(setup) if setup.is_file() else None)
        if pairing is None:
            raise StackError(f"{where}: MindSpeed {branch} declares no Megatron release ({readme.relative_to(ROOT)})")
        return Expected((pairing.megatron,), f"MindSpeed {branch} pairs with it ({pairing.declared_by}, "
                                             f"{data.relative_to(ROOT)})", by_minor=True)
    if source == "emulated-lane":
        try:
            jobs = yaml.safe_load(_load(EMULATED_LANE, where))["jobs"]
            rows = [row for job in jobs.values() for row in job["strategy"]["matrix"]["include"]]
        except (KeyError, TypeError, yaml.YAMLError):
            raise StackError(f"{where}: {EMULATED_LANE.relative_to(ROOT)} has no matrix of pairings") from None
        row = next((r for r in rows if str(r.get("pairing")) == branch), None)
        if row is None:
            raise StackError(f"{where}: the emulated lane ({EMULATED_LANE.relative_to(ROOT)}) runs no MindSpeed "
                             f"{branch}")
        constraints = ROOT / str(row.get("constraints"))
        pins = {_normalise(m.group(1)): m.group(3) for line in _load(constraints, where).splitlines()
                if (m := _PIN.match(line.strip()))}
        if "megatron-core" not in pins:
            raise StackError(f"{where}: {constraints.relative_to(ROOT)} pins no megatron-core")
        return Expected((pins["megatron-core"],), f"the emulated lane's megatron-core for {branch} "
                                                  f"({constraints.relative_to(ROOT)})", by_minor=True)
    raise StackError(f"{where}: unknown source {source!r} (wheelhouse, emulated-torch_npu, mindspeed-pairing, "
                     "emulated-lane)")


def declared_stacks(path: Path = STACKS) -> dict[str, dict[str, list[Expected]]]:
    """Variable -> package -> what the stack naming that variable declares (every `from:` resolved)."""
    try:
        stacks = (yaml.safe_load(_load(path, str(path))) or {}).get("stacks")
    except yaml.YAMLError as error:
        raise StackError(f"{path}: {error}") from None
    if not isinstance(stacks, dict):
        raise StackError(f"{path}: no `stacks:` mapping")
    out: dict[str, dict[str, list[Expected]]] = {}
    for name, stack in stacks.items():
        if not isinstance(stack, dict):
            raise StackError(f"{path}: stack {name} is not a mapping")
        where = f"{path.name}: stacks.{name}"
        if missing := [p for p in PACKAGES if p not in stack]:
            raise StackError(f"{where}: declares no {', '.join(missing)}")
        if unknown := sorted(set(stack) - set(PACKAGES) - {"variables"}):
            raise StackError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(PACKAGES)})")
        expected: dict[str, list[Expected]] = {}
        for package in PACKAGES:
            entries = stack[package] if isinstance(stack[package], list) else [stack[package]]
            expected[package] = []
            for entry in entries:
                if isinstance(entry, dict) and "from" in entry:
                    expected[package].append(_from(str(entry["from"]), stack, f"{where}.{package}"))
                elif isinstance(entry, dict) and "commit" in entry:
                    version = str(entry["version"]) if "version" in entry else None
                    expected[package].append(Expected((str(entry["commit"]),), f"{path.name} ({name})",
                                                      commit_version=version))
                elif isinstance(entry, (str, int, float)):
                    expected[package].append(Expected((str(entry),), f"{path.name} ({name})"))
                else:
                    raise StackError(f"{where}.{package}: {entry!r} is neither a version nor {{from: SOURCE}}")
        for variable in stack.get("variables") or []:
            out[str(variable)] = expected
    return out


def _release(value: str) -> str | None:
    """'releases/v0.23.0' -> '0.23.0', 'core_r0.16.0' -> '0.16.0', '2.10.0+cpu' -> '2.10.0'."""
    found = _RELEASE.search(_public(value.rsplit("/", 1)[-1]))
    return found.group(1) if found else None


def matches(package: str, expected: Expected, value: str) -> bool:
    if package == "mindspeed":
        return value in expected.values
    if package == "transformers" and any(_COMMIT.match(v) for v in expected.values):
        return bool(_COMMIT.match(value)) and any(v.startswith(value) or value.startswith(v) for v in expected.values)
    have = _release(value)
    if have is None:
        return False
    for want in expected.values:
        parts = want.split(".")[:2] if expected.by_minor else want.split(".")
        if have.split(".")[:len(parts)] == parts:
            return True
    return False


def drift(image: Image, expected: dict[str, list[Expected]]) -> list[str]:
    """Each declared package the image's Dockerfile states otherwise (both architectures in one line when alike)."""
    assert image.stack is not None
    lines: dict[str, list[str]] = {}
    for package in PACKAGES:
        for arch in ARCHES:
            found = image.stack.versions[arch].get(package)
            for want in expected[package]:
                if found is not None and matches(package, want, found.value):
                    continue
                said = " or ".join(want.values)
                if found is None:
                    unread = "; unread: " + ", ".join(image.stack.unread[arch]) if image.stack.unread[arch] else ""
                    text = f"{package} is not declared by {image.dockerfile}{unread}; {want.source} says {said}"
                else:
                    text = f"{package} {found.value} ({found.source}); {want.source} says {said}"
                lines.setdefault(text, []).append(arch)
    return [f"{image.variable}: {image.tag} {text} [{', '.join(arches)}]" for text, arches in lines.items()]


# --- the images -------------------------------------------------------------------------------------------------


def facts(verl: Path, nightly: Path = NIGHTLY, repos: dict[str, Path] | None = None) -> list[Image]:
    if not (verl / "docker" / "ascend").is_dir():
        raise StackError(f"{verl}: no docker/ascend (a checkout of verl-project/verl?)")
    built, rows = verl_builds(verl), supported_tags(verl)
    found = []
    for variable, image in nightly_images(nightly).items():
        tag = image.rsplit(":", 1)[-1]
        listed = [r for r in rows if r.tag == tag]
        dockerfile = built.get(tag) or next((r.dockerfile for r in listed if r.dockerfile), None)
        stack = None
        if dockerfile and (path := verl / "docker" / "ascend" / dockerfile).is_file():
            stack = dockerfile_stack(path.read_text(), dockerfile, repos)
        entry = Image(variable, image, tag, dockerfile, tag in built, tuple(dict.fromkeys(r.section for r in listed)),
                      stack)
        if not entry.built and all(r.section == HISTORY for r in listed):
            where = "only under 'History Images' in" if listed else "nowhere in"
            entry.refusal = (f"{variable}: {image} is REFUSED: verl lists `{tag}` {where} docker/ascend/"
                             f"supported_tags.md and none of its docker-build-ascend-*.yml builds it (it no longer "
                             f"updates); verl builds now: {_built_now(listed[0] if listed else None, built, rows)}")
        found.append(entry)
    return found


def findings(images: list[Image], stacks: dict[str, dict[str, list[Expected]]]) -> tuple[list[str], list[str]]:
    """(refusals, drift) over the nightly's images."""
    refused, drifted = [], []
    for image in images:
        if image.refusal:
            refused.append(image.refusal)
        if image.variable not in stacks:
            raise StackError(f"{image.variable}: no declared stack names it (`variables:` in ci/ascend_stacks.yaml)")
        if image.stack is None:
            drifted.append(f"{image.variable}: {image.image}: no Dockerfile found for `{image.tag}` "
                           f"({image.dockerfile or 'neither built nor listed by verl'})")
        else:
            drifted += drift(image, stacks[image.variable])
    return refused, drifted


def _cell(stack: ImageStack | None, package: str, arches: tuple[str, ...] = ARCHES) -> str:
    if stack is None:
        return "—"
    values = {a: (stack.versions[a].get(package).value if stack.versions[a].get(package) else "—") for a in arches}
    short = {a: (v[:9] if _COMMIT.match(v) else v) for a, v in values.items()}
    return short[arches[0]] if len(set(short.values())) == 1 else " / ".join(f"{a}: {v}" for a, v in short.items())


def table(images: list[Image]) -> list[str]:
    lines = ["| variable | image | Dockerfile | verl builds it | Python | CANN | torch x86_64 | torch aarch64 | "
             "torch_npu | transformers | MindSpeed | Megatron-LM | vllm | vllm-ascend |",
             "|" + "---|" * 14]
    for i in images:
        built = "yes" if i.built else ("REFUSED" if i.refusal else f"no ({', '.join(i.listed_in)}: frozen)")
        cells = [_cell(i.stack, "python"), _cell(i.stack, "cann"), _cell(i.stack, "torch", ("x86_64",)),
                 _cell(i.stack, "torch", ("aarch64",)), *(_cell(i.stack, p) for p in PACKAGES[3:])]
        lines.append(f"| {i.variable} | `{i.tag}` | {i.dockerfile or '—'} | {built} | " + " | ".join(cells) + " |")
    return lines


def image_env(image: Image, arch: str, stacks: dict[str, dict[str, list[Expected]]]) -> list[str]:
    """The versions ci/image_stack.sh installs, as shell assignments: what the Dockerfile states for `arch`, and for
    a transformers commit the version ci/ascend_stacks.yaml gives it (no index serves a commit) and its release."""
    assert image.stack is not None
    have = image.stack.versions[arch]
    missing = [p for p in ("python", "torch", "megatron_lm", "transformers", "mindspeed") if p not in have]
    if missing:
        raise ValueError(f"{image.variable}: {image.dockerfile} states no {', '.join(missing)} on {arch}")
    env = {"IMAGE": image.image, "DOCKERFILE": image.dockerfile or "", "ARCH": arch, "PYTHON": have["python"].value,
           "TORCH": _public(have["torch"].value), "MINDSPEED": have["mindspeed"].value,
           "MEGATRON_CORE": _release(have["megatron_lm"].value) or "", "TRANSFORMERS": have["transformers"].value}
    if _COMMIT.match(env["TRANSFORMERS"]):
        declared = next((e for e in stacks[image.variable]["transformers"]
                         if e.commit_version and matches("transformers", e, env["TRANSFORMERS"])), None)
        if declared is None:
            raise ValueError(f"transformers commit {env['TRANSFORMERS']} ({image.dockerfile}) is not a commit the "
                             f"declared stack of {image.variable} gives a version")
        dev = declared.commit_version or ""
        env["TRANSFORMERS_COMMIT"], env["TRANSFORMERS_COMMIT_VERSION"] = env["TRANSFORMERS"], dev
        env["TRANSFORMERS"] = _release(dev.split(".dev")[0]) or dev
    return [f"{key}={shlex.quote(value)}" for key, value in env.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verl", type=Path, help="a checkout of verl-project/verl")
    parser.add_argument("--repo", action="append", default=[], metavar="NAME=GIT_DIR",
                        help="a clone of a repository the Dockerfiles clone (vllm-ascend=...), read with git show")
    parser.add_argument("--image", metavar="VARIABLE", help="print this image's versions as shell assignments")
    parser.add_argument("--arch", choices=ARCHES, default="aarch64", help="for --image (default: the runners')")
    parser.add_argument("--nightly", type=Path, default=NIGHTLY, help="the workflow with the `pick` step")
    parser.add_argument("--stacks", type=Path, default=STACKS, help="the declared stacks")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:
        return 2 if stop.code else 0
    repos = {}
    for item in args.repo:
        name, _, path = item.partition("=")
        if not path or not Path(path).is_dir():
            print(f"--repo {item}: expected NAME=GIT_DIR with an existing directory", file=sys.stderr)
            return 2
        repos[name] = Path(path)
    repos.setdefault("verl", args.verl)  # the Dockerfiles clone verl's default branch: VERL_DIR is one
    try:
        stacks = declared_stacks(args.stacks)
        images = facts(args.verl, args.nightly, repos)
        refused, drifted = findings(images, stacks)
        if args.image:
            image = next((i for i in images if i.variable == args.image), None)
            if image is None or image.stack is None:
                raise StackError(f"--image {args.image}: not a default image of the nightly with a Dockerfile "
                                 f"({', '.join(i.variable for i in images)})")
            try:
                print("\n".join(image_env(image, args.arch, stacks)))
            except ValueError as error:
                print(f"::error title=Ascend stack::{error}", file=sys.stderr)
                return 3
            return 0
    except StackError as error:
        print(f"::error title=Ascend stack (cannot check)::{error}", file=sys.stderr)
        return 2
    print("\n".join(table(images)))
    for problem in refused:
        print(f"::error title=Ascend image refused::{problem}")
    for problem in drifted:
        print(f"::error title=Ascend stack drift::{problem}")
    return 1 if refused else 3 if drifted else 0


if __name__ == "__main__":
    raise SystemExit(main())
