"""ci/check_install.py accepts a pre-release installed version (5.0.0.dev0: transformers installed editable from a git
commit) whatever the `packaging` it runs with: `version in specifier` refuses one under packaging < 26 and accepts
it from 26 on. Run under this venv's packaging and under the 21.3 that the standard library's bundled pip vendors
(offline), against distributions planted on sys.path; the planted `in` check is caught under the old one."""

from __future__ import annotations

import ensurepip
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.torch_free

SCRIPT = REPO / "ci" / "check_install.py"
FIXED = "requirement.specifier.contains(installed, prereleases=True)"
PLANTED = "installed in requirement.specifier"  # the check as it was

# argv: the pip wheel whose vendored packaging stands in for `packaging` ("" = this venv's), the planted site
# directory, the check's source file; prints packaging's version, then one problem per line
RUNNER = """
import importlib.util, sys
wheel, site, script = sys.argv[1:]
if wheel:
    sys.path.insert(0, wheel)
    import pip._vendor.packaging.requirements, pip._vendor.packaging.specifiers, pip._vendor.packaging.version
    for name, module in list(sys.modules.items()):
        if name.startswith("pip._vendor.packaging"):
            sys.modules[name.removeprefix("pip._vendor.")] = module
sys.path.insert(0, site)
spec = importlib.util.spec_from_file_location("check_install", script)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)
import packaging
print(packaging.__version__)
print("\\n".join(check.problems("fake-harness", plugin=None)))
"""

INSTALLED = {"fake-harness": ("0.1", ["fake-transformers>=4.51", "fake-old>=2"]),
             "fake-transformers": ("5.0.0.dev0", []),  # what an editable install from a git commit reports
             "fake-old": ("1.0", [])}
TOO_OLD = "fake-old: 1.0 is installed, the harness needs fake-old>=2"
PRERELEASE_REFUSED = "fake-transformers: 5.0.0.dev0 is installed, the harness needs fake-transformers>=4.51"


def _site(root: Path) -> Path:
    for name, (version, requires) in INSTALLED.items():
        module = name.replace("-", "_")
        info = root / f"{module}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                       + "".join(f"Requires-Dist: {r}\n" for r in requires))
        (info / "top_level.txt").write_text(f"{module}\n")
        (root / module).mkdir()
        (root / module / "__init__.py").write_text("")
    return root


def _old_packaging_wheel() -> str:
    """The pip wheel bundled with the standard library: its vendored packaging is an old release (21.3)."""
    wheels = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not wheels:
        pytest.skip("this Python bundles no pip wheel (ensurepip/_bundled)")
    return str(wheels[-1])


def _check(tmp_path: Path, wheel: str, source: str) -> tuple[str, list[str]]:
    script = tmp_path / "check_install.py"
    script.write_text(source)
    site = tmp_path / "site" if (tmp_path / "site").is_dir() else _site(tmp_path / "site")
    done = subprocess.run([sys.executable, "-c", RUNNER, wheel, str(site), str(script)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    version, *problems = done.stdout.splitlines()
    return version, [p for p in problems if p]


@pytest.mark.parametrize("old", [True, False], ids=["packaging-21.3", "this-venv's-packaging"])
def test_a_prerelease_meets_its_requirement_under_any_packaging(tmp_path, old):
    source = SCRIPT.read_text()
    assert FIXED in source
    _, problems = _check(tmp_path, _old_packaging_wheel() if old else "", source)
    assert problems == [TOO_OLD]  # the pre-release passes; a version below the requirement is still caught


def test_the_planted_membership_check_refuses_the_prerelease_under_old_packaging(tmp_path):
    version, problems = _check(tmp_path, _old_packaging_wheel(), SCRIPT.read_text().replace(FIXED, PLANTED))
    if int(version.split(".")[0]) >= 26:
        pytest.skip(f"the bundled pip vendors packaging {version}, which accepts pre-releases in `in`")
    assert problems == [PRERELEASE_REFUSED, TOO_OLD]


def test_an_unreadable_installed_version_is_named_not_a_traceback(tmp_path):
    _site(tmp_path / "site")
    info = tmp_path / "site" / "fake_transformers-5.0.0.dev0.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-transformers\nVersion: not-a-version\n")
    for wheel in (_old_packaging_wheel(), ""):
        _, problems = _check(tmp_path, wheel, SCRIPT.read_text())
        assert problems[0].startswith("fake-transformers: not-a-version is installed"), (wheel, problems)
