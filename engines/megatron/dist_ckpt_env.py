"""Whether megatron-core's own dist-ckpt writer can run on the installed torch and numpy (the Megatron engines'
`checkpoint_check`), read from the packages' source without importing them: a release paired with an older stack
calls what a newer torch or numpy no longer has, and its save would die in a forked writer."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy


def _source(package: str, relative: str) -> str | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path.read_text() if path.is_file() else None


def dist_ckpt_problem() -> str | None:
    """megatron-core 0.12's FileSystemWriterAsync calls torch's `_write_item` without the `serialization_format`
    torch 2.7+ requires (megatron/core/dist_checkpointing/strategies/filesystem_async.py), and its sharded-tensor
    mapping calls `np.product`, which numpy 2 removed (megatron/core/dist_checkpointing/mapping.py)."""
    writer = _source("megatron", "core/dist_checkpointing/strategies/filesystem_async.py")
    mapping = _source("megatron", "core/dist_checkpointing/mapping.py")
    torch_writer = _source("torch", "distributed/checkpoint/filesystem.py")
    if writer is None or mapping is None or torch_writer is None:
        return None
    problems = []
    signature = re.search(r"def _write_item\((.*?)\)", torch_writer, re.S)
    if signature and "serialization_format" in signature.group(1) and "serialization_format" not in writer:
        problems.append("its async writer calls torch's _write_item without serialization_format "
                        "(megatron/core/dist_checkpointing/strategies/filesystem_async.py)")
    if "np.product(" in mapping and not hasattr(numpy, "product"):
        problems.append("it calls np.product, which numpy 2 removed (megatron/core/dist_checkpointing/mapping.py)")
    if not problems:
        return None
    return "megatron-core's dist-ckpt writer cannot run on this torch / numpy: " + "; ".join(problems)
