"""The emulated torch_npu's op tests (emulated_ops_cases.py) run in their OWN pytest, in a process of its own:
importing the emulation registers 'npu' as torch's PrivateUse1 device and patches FSDP's mesh-device lookup, which
no fixture can undo, and no other test of this suite may run under a patched torch. The process is forked from the
session's forkserver (tests/forked.py): a fresh interpreter would spend most of its time importing torch and
pytest."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.forked import run_forked

CASES = Path(__file__).with_name("emulated_ops_cases.py")


def run_cases(log: str) -> int:
    """In the forked child: pytest over the cases (without the parity plugin), its output in `log`."""
    import pytest

    with open(log, "w") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    os.chdir(CASES.parent)
    return int(pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:parity", str(CASES)]))


def test_every_emulated_op_case_passes_in_a_separate_process(tmp_path):
    log = tmp_path / "cases.log"
    returncode = run_forked(run_cases, str(log), timeout=600)
    output = log.read_text(errors="replace")
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    assert returncode == 0, output[-8000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 70, summary  # the op cases ran, not an empty collection
