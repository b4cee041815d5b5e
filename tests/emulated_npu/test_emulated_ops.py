"""The emulated torch_npu's op tests (emulated_ops_cases.py) run in their OWN pytest process: importing the
emulation registers 'npu' as torch's PrivateUse1 device and patches FSDP's mesh-device lookup, which no fixture can
undo, and no other test of this suite may run under a patched torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("emulated_ops_cases.py")


def test_every_emulated_op_case_passes_in_a_separate_process():
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:parity",
                             str(CASES)], capture_output=True, text=True, timeout=600, cwd=CASES.parent)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 70, summary  # the op cases ran, not an empty collection
