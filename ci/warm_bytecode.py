"""Import what a test session imports first, so that its byte code is compiled in the background of .ci/run's
lint step. The venv is installed without byte-compiling (ci/install_cpu.sh: most of torch / transformers /
megatron is never imported), so the session's first imports compile torch, transformers, megatron.core and the
tiny models' modeling files from source on one core, while the other idles through collection and the first
tests. Importing is the only way to know which files those are; a module that fails to import here is skipped
(the tests report it)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import warnings
from pathlib import Path

from parity.harness.config.matrix import load_file
from parity.harness.config.registry import SPECS, import_path
from parity.harness.run.preload import forkserver_preload

REPO = Path(__file__).resolve().parents[1]
#: the pytest process itself: the runner and judge (torch), the reports (matplotlib); the engines' unit tests
#: import the engine classes (below)
SESSION = ("parity.harness.runner", "parity.reports.publish", "parity.reports.html", "matplotlib.pyplot")


def main() -> int:
    warnings.simplefilter("ignore")
    ranks, _ = forkserver_preload(load_file(REPO / "scenarios" / "cpu.yaml"))
    for module in dict.fromkeys([*SESSION, *ranks]):
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    for spec in SPECS.values():  # every engine class that can run here, through the registry
        if not spec.missing():
            with contextlib.suppress(Exception):
                import_path(spec.engine)
    print(f"warm_bytecode: imported {len(sys.modules)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
