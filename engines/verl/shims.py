"""Every device shim the verl engines need on a CPU-only box, in one place. Each goes through verl's own extension
point where verl has one (its platform registry, VERL_ENGINE_DEVICE), changes no numbers (no op, dtype, reduction
or mask is altered: they let CPU tensors through checks written for accelerators), and names the verl or torch
file it bridges; docs/verl.md lists them. On an accelerator none of them is applied.

`select_platform` runs before verl is imported (verl resolves its platform at import: the FSDP engine module reads
`get_device_name()` at module level); `apply` patches torch once verl is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Shim:
    name: str
    bridges: str
    """The upstream file (and line in verl 0.9.1) whose CPU-hostile code it bridges."""
    what: str


PLATFORM = Shim(
    "cpu-platform", "verl/plugin/platform/platform_manager.py:114",
    "verl falls back to the 'nvidia' platform when it finds no accelerator; a CPU platform is registered through "
    "verl's platform registry (engines/verl/cpu_platform.py, loaded by VERL_USE_EXTERNAL_MODULES) and chosen with "
    "VERL_PLATFORM=cpu")
ENGINE_DEVICE = Shim(
    "engine-device", "verl/workers/engine/fsdp/transformer_impl.py:1143, megatron/transformer_impl.py:1171",
    "verl registers its engines for cuda / npu only; VERL_ENGINE_DEVICE (read by EngineRegistry.get_engine_cls, "
    "verl/workers/engine/base.py:405) picks the class registered for the device the scenario emulates")
FSDP1_SYNC = Shim(
    "fsdp1-sync-module-states", "verl/workers/engine/fsdp/transformer_impl.py:444 + "
    "torch/distributed/fsdp/_init_utils.py _check_module_states_for_sync_module_states",
    "verl's FSDP1 path hard-codes sync_module_states=True, and torch refuses CPU tensors for it; the check is "
    "skipped on CPU, the broadcast from rank 0 still runs (gloo broadcasts CPU tensors)")
PINNED_OFFLOAD = Shim(
    "fsdp2-pinned-offload", "verl/workers/engine/fsdp/transformer_impl.py:462",
    "verl's FSDP2 offload_policy hard-codes CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator. On "
    "CPU the policy is built without pinning (where the parameters live and every number is the same)")

CPU_EMPTY_CACHE = Shim(
    "cpu-empty-cache", "verl/utils/fsdp_utils.py:60 (init_fn) and 26 more get_torch_device().empty_cache() calls",
    "torch.cpu has no empty_cache; the CPU allocator keeps no cache to empty, so torch.cpu gets a no-op one")

CPU_SHIMS = (PLATFORM, ENGINE_DEVICE, FSDP1_SYNC, PINNED_OFFLOAD, CPU_EMPTY_CACHE)

_applied: list[str] = []


def select_platform(device: str, engine_device: str) -> list[str]:
    """Before verl is imported: on CPU, verl's platform is the harness's CPU platform; verl's engine registry picks
    the class registered for `engine_device` ('cuda', or 'npu' for verl's MindSpeed engine)."""
    if device != "cpu":
        return []
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(
        dict.fromkeys([*filter(None, os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")),
                       "parity.engines.verl.cpu_platform"]))
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ["VERL_ENGINE_DEVICE"] = engine_device
    return [PLATFORM.name, ENGINE_DEVICE.name]


def platform_problem(device: str) -> str | None:
    """Whether verl resolved the platform this process asked for (a forkserver that imported verl for another
    device would hand its ranks the wrong one)."""
    from verl.utils.device import get_device_name

    resolved = get_device_name()
    wanted = "cpu" if device == "cpu" else device
    if resolved != wanted:
        return f"verl resolved its platform to {resolved!r}, the scenario runs on {device!r}"
    return None


def apply(device: str) -> list[str]:
    """The torch-level shims, once verl is imported; returns the names applied (for the record's provenance)."""
    if device != "cpu":
        return []
    if not _applied:
        _skip_fsdp1_sync_device_check()
        _unpinned_offload_policy()
        _cpu_empty_cache()
        _applied.extend([FSDP1_SYNC.name, PINNED_OFFLOAD.name, CPU_EMPTY_CACHE.name])
    return list(_applied)


def _skip_fsdp1_sync_device_check() -> None:
    from torch.distributed.fsdp import _init_utils

    def check(module_states: list[Any]) -> None:
        return None

    _init_utils._check_module_states_for_sync_module_states = check


def _unpinned_offload_policy() -> None:
    import torch.distributed.fsdp as fsdp
    from verl.workers.engine.fsdp import transformer_impl

    original = fsdp.CPUOffloadPolicy

    def unpinned(pin_memory: bool = True) -> Any:
        return original(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = unpinned


def _cpu_empty_cache() -> None:
    import torch

    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None
