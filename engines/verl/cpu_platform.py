"""A CPU platform for verl's platform registry (verl/plugin/platform/platform_manager.py), so that verl's engines
run on a CPU-only box on gloo. verl imports this module itself: the harness names it in VERL_USE_EXTERNAL_MODULES
and selects it with VERL_PLATFORM=cpu (engines/verl/shims.py). Without it verl falls back to the 'nvidia' platform
when no accelerator is found (platform_manager.py `_detect_platform_name`), and every `.to(get_device_id())`
targets cuda:0.

Nothing here computes: each method answers what a CPU has (one device, no caches, gloo). The platform never
offers itself to verl's auto-detection (`is_platform_available` is False): it runs only where selected by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

NAME = "cpu"



@PlatformRegistry.register(platform=NAME)
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        # torch.cpu itself: verl's own CPU cases compare with it (verl/utils/profiler/performance.py)
        return torch.cpu

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False

    def current_device(self) -> Any:
        # verl moves tensors with `.to(get_device_id())`: the device itself, as `torch.device` takes it
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
