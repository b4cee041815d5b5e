"""Warnings raised while the forkserver preloads engines go to each rank's log, not to the terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch_free

SCRIPT = """
import sys, warnings
import parity.harness.run.rank_warnings as rank_warnings
warnings.warn("Apex is not installed. Falling back to Torch Norm")
print("captured:", len(rank_warnings.CAPTURED))
rank_warnings.replay(sys.stdout)
warnings.warn("a warning raised inside the rank")
"""


def test_preload_warnings_are_kept_and_replayed_into_the_rank_log():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.startswith("captured: 1\n") and "Falling back to Torch Norm" in done.stdout
    # the preload warning never reached the terminal (stderr); a rank's own warning does, into its log
    assert "Falling back" not in done.stderr and "a warning raised inside the rank" in done.stderr
