"""Run options defined once for both the `parity` CLI and the pytest plugin (prefix 'parity-' there)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.runner import RunOptions

OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("device", {"choices": ["cpu", "cuda", "npu"], "default": None,
                "help": "run every scenario on this device (the fp32 reference stays on CPU)"}),
    ("out", {"default": "parity-out", "help": "output directory (results.jsonl, summary.md, records/)"}),
    ("cache-dir", {"default": ".parity-cache", "help": "tiny model checkpoints and cached reference runs"}),
    ("launcher", {"choices": ["forked", "torchrun"], "default": "forked",
                  "help": "forked: ranks forked from a warm forkserver (fast); torchrun: one torchrun per run"}),
]


def add_options(add: Callable[..., Any], prefix: str = "") -> None:
    for name, kwargs in OPTIONS:
        add(f"--{prefix}{name}", **kwargs)


def run_options(get: Callable[[str], Any]) -> RunOptions:
    """Build RunOptions from a getter of option values by dest name ('out', 'cache_dir', ...)."""
    return RunOptions(out_dir=Path(get("out")), cache_dir=Path(get("cache_dir")), launcher=get("launcher"))
