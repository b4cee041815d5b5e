"""The MindSpeed pairing table (docs/ascend.md) is generated from MindSpeed's branch files
(tests/emulated_npu/mindspeed_pairings.py):
the doc equals what the data renders, the data equals MindSpeed's branches where a mirror is on disk, and the reader
catches a planted change (a branch newly marked unmaintained, a tree losing mindspeed/fsdp)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "emulated_npu" / "mindspeed_pairings.py"
MIRROR = Path(os.environ.get("PARITY_MINDSPEED_MIRROR", "/work/.mirror/Ascend+MindSpeed/repo"))

pytestmark = pytest.mark.torch_free


def _module():
    spec = importlib.util.spec_from_file_location("mindspeed_pairings_tool", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pairings = _module()


def _doc_table() -> str:
    text = (ROOT / "docs" / "ascend.md").read_text()
    begin = text.index("<!-- mindspeed-pairings:begin")
    begin = text.index("\n", begin) + 1
    return text[begin:text.index("<!-- mindspeed-pairings:end -->")].strip()


def test_the_doc_table_is_what_the_branch_files_render():
    assert _doc_table() == pairings.table()


def test_the_table_carries_the_facts_verl_s_images_hinge_on():
    rows = {b.name: b for b in pairings.branches()}
    assert {"2.2.0_core_r0.12.1", "26.0.0_core_r0.12.1", "dev", "core_r0.17.0", "core_r0.18.0"} <= set(rows)
    assert rows["2.3.0_core_r0.12.1"].status == "unmaintained"  # verl's older images ship it
    assert rows["26.0.0_core_r0.12.1"].has_fsdp and rows["26.1.0_core_r0.12.1"].has_fsdp
    assert not rows["core_r0.16.0"].has_fsdp
    assert rows["dev"].pairs_with == "1d462bd37"  # a Megatron-LM commit, no release


def test_a_planted_change_in_a_branch_s_files_changes_the_table(tmp_path):
    data = tmp_path / "branches"
    shutil.copytree(pairings.DATA, data)
    clean = pairings.table(data)
    readme = data / "master" / "README.md"
    readme.write_text(readme.read_text().replace("| 26.0.0_core_r0.12.1 | 常规版本     | 维护 ",
                                                 "| 26.0.0_core_r0.12.1 | 常规版本     | 停止维护 "))
    (data / "26.1.0_core_r0.12.1" / "fsdp").write_text("mindspeed/fsdp absent at planted\n")
    rows = {b.name: b for b in pairings.branches(data)}
    assert rows["26.0.0_core_r0.12.1"].status == "unmaintained" and not rows["26.1.0_core_r0.12.1"].has_fsdp
    assert pairings.table(data) != clean


@pytest.mark.skipif(not (MIRROR / "HEAD").is_file(), reason=f"no MindSpeed git mirror at {MIRROR} "
                    "($PARITY_MINDSPEED_MIRROR; `git clone --mirror https://github.com/Ascend/MindSpeed`)")
def test_the_data_is_what_mindspeed_s_branches_say(tmp_path):
    names = pairings.extract(MIRROR, tmp_path)
    assert names == sorted(p.name for p in pairings.DATA.iterdir() if p.is_dir())
    for name in names:
        for file in ("README.md", "setup.py", "fsdp"):
            assert (tmp_path / name / file).read_text() == (pairings.DATA / name / file).read_text(), (name, file)
