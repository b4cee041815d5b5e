"""Runs a probe script in a fresh interpreter over the emulated torch_npu (tests/emulated_npu/site first on its path)
with the emulated-card variables of this process removed, then the ones given: the emulation patches torch process-
wide at import, so it never runs in the test process. Not a test module."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

SITE = REPO / "tests" / "emulated_npu" / "site"


def run_probe(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PARITY_EMULATED_NPU_CARDS", "ASCEND_RT_VISIBLE_DEVICES")}
    path = os.pathsep.join([str(SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", code], env={**clean, "PYTHONPATH": path, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
