"""The one place that knows each device kind (backend, visible-devices variable, set/sync/seed, memory,
determinism and precision settings) and each accelerator model (HBM per card, room for peak FLOP/s).
torch_npu is imported lazily and only for npu (it breaks `import torch` on CPU boxes).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class DeviceKind:
    name: str
    backend: str
    """torch.distributed backend."""
    visible_env: str | None
    """Environment variable that selects the cards a process sees."""
    determinism_env: dict[str, str] = field(default_factory=dict)
    """Set in every rank before the backend initialises."""
    precision_flags: dict[str, bool] = field(default_factory=dict)
    """Attribute path under `torch` -> value, set in every rank: reduced-precision fp32 matmul/conv OFF, so an
    fp32 run on the device is judged on the strict fp32 limits against the CPU fp32 reference."""
    default_model: str | None = None
    cuda_api_shim: str | None = None
    """Module that maps `torch.cuda.*` onto this device, imported in a rank before an engine that calls torch.cuda
    by name (EngineSpec.cuda_apis) — and before that engine's own imports, which bind torch.cuda names at import."""
    """Card name (as get_device_name() reports it) a memory plan assumes; $PARITY_DEVICE_MODEL overrides. npu:
    verl's linux-aarch64-a2b3-* runners carry Atlas A2 910B3 cards."""


DEVICE_KINDS: dict[str, DeviceKind] = {
    "cpu": DeviceKind("cpu", "gloo", None),
    "cuda": DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES",
                       {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring"},
                       {"backends.cuda.matmul.allow_tf32": False, "backends.cudnn.allow_tf32": False},
                       default_model="NVIDIA H100 80GB HBM3"),
    # Ascend precision recipe (verl / MindSpeed): deterministic HCCL + matmul without K-shift/shuffle; under LCCL (the
    # AIV expansion mode verl's MoE jobs use) also LCOC off (verl docs/ascend_tutorial/dev_guide/precision_analysis/
    # precision_alignment_zh.md, "LCCL通信下": ATB_LLM_LCOC_ENABLE=0 beside LCCL_DETERMINISTIC=1); HF32
    # (Ascend's TF32) off for matmul (default already off) and conv (default ON), per the torch_npu API reference
    # (torch_npu.npu.matmul.allow_hf32, torch_npu.npu.conv.allow_hf32).
    "npu": DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES",
                      {"HCCL_DETERMINISTIC": "true", "CLOSE_MATMUL_K_SHIFT": "1",
                       "ATB_MATMUL_SHUFFLE_K_ENABLE": "0", "LCCL_DETERMINISTIC": "1", "ATB_LLM_LCOC_ENABLE": "0"},
                      {"npu.matmul.allow_hf32": False, "npu.conv.allow_hf32": False},
                      default_model="Ascend910B3",
                      # MindSpeed's adaptor imports it first thing (mindspeed/megatron_adaptor.py line 11) so that
                      # Megatron-Core's torch.cuda RNG tracker, streams and `.cuda()` calls land on the NPU
                      cuda_api_shim="torch_npu.contrib.transfer_to_npu"),
}


def planning_model(device: str) -> DeviceModel | None:
    """The card a memory plan assumes for `device`: $PARITY_DEVICE_MODEL (a card name as get_device_name()
    reports it) or the kind's default; None on cpu."""
    name = os.environ.get("PARITY_DEVICE_MODEL") or DEVICE_KINDS[device].default_model
    return device_model(name) if name else None


def apply_precision_flags(device: str) -> None:
    """Set the kind's precision flags (`torch.<path> = value`); a flag this torch_npu / torch lacks is an
    error, never silently skipped: the strict lane would otherwise judge a run that used HF32/TF32."""
    import torch

    for path, value in DEVICE_KINDS[device].precision_flags.items():
        *parents, attr = path.split(".")
        target: Any = torch
        for part in parents:
            target = getattr(target, part)
        if not hasattr(target, attr):
            raise RuntimeError(f"torch.{path} does not exist here; cannot set it to {value}")
        setattr(target, attr, value)

CPU_MAX_RANKS = int(os.environ.get("PARITY_CPU_MAX_RANKS") or "16")  # empty reads as unset, as every variable


def availability(device: str) -> tuple[int, str | None]:
    """(number of devices, None) or (0, why this device cannot be used here)."""
    if device == "cpu":
        return CPU_MAX_RANKS, None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return 0, "no CUDA device (torch.cuda.is_available() is False)"
        return torch.cuda.device_count(), None
    if device == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            return 0, "torch_npu is not installed (needs an Ascend image with CANN)"
        try:
            torch_npu = importlib.import_module("torch_npu")
        except Exception as exc:  # CANN libraries missing, driver absent, ...
            return 0, f"torch_npu does not import: {type(exc).__name__}: {exc}"
        if not torch_npu.npu.is_available():
            return 0, "torch_npu imports but no NPU is visible"
        return torch_npu.npu.device_count(), None
    return 0, f"unknown device '{device}'"


def npu_emulated() -> bool:
    """True when the torch_npu on the path is the emulated one (tests/emulated_npu/site: plain-torch reference ops
    on CPU), so NPU-only engines may run with device cpu. Decided from its files, never by importing: importing a
    real torch_npu without CANN breaks torch."""
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or not spec.origin:
        return False
    marker = Path(spec.origin).parent / "emulation.py"
    try:
        return "EMULATED = True" in marker.read_text()
    except OSError:
        return False


def device_module(device: str) -> Any:
    """torch.cuda / torch.npu (after importing torch_npu); None for cpu."""
    import torch

    if device == "npu":
        importlib.import_module("torch_npu")
        return torch.npu
    return torch.cuda if device == "cuda" else None


def cpu_share(allowed: list[int], local_rank: int, ranks_here: int) -> list[int]:
    """This rank's slice of the CPUs the node's ranks may use: disjoint slices of len(allowed) // ranks_here
    cores, or one core each, round robin, when there are more ranks than cores."""
    per_rank = max(1, len(allowed) // ranks_here)
    start = local_rank * per_rank % len(allowed)
    return allowed[start:start + per_rank]


def bind_cpu_rank(local_rank: int, ranks_here: int) -> list[int] | None:
    """Pin a CPU rank (and the gloo threads it starts later) to its own cores, one intra-op thread per core.
    Unpinned, the ranks' main and gloo threads migrate between cores at every collective, which slows the
    multi-rank rows down (benchmarks/cpu_binding.py measures it). PARITY_CPU_BIND=0 keeps the threads and leaves
    the cores to the OS (a runner shared with other jobs). Returns the cores the rank is pinned to, None where it
    is not."""
    import torch

    pin = hasattr(os, "sched_setaffinity") and os.environ.get("PARITY_CPU_BIND", "1") != "0"  # macOS has none
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = cpu_share(allowed, local_rank, ranks_here)
    if pin:
        os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))
    return share if pin else None


def import_cuda_api_shim(device: str, binds: tuple[str, ...]) -> str | None:
    """In a rank, before an engine that calls torch.cuda by name: import the device's cuda_api_shim (None where
    the device needs none). `binds` are the top-level modules that bind torch.cuda names at import (Megatron-Core's
    `from torch.cuda import _lazy_call`): one already imported would keep CUDA's functions, so that is an error."""
    shim = DEVICE_KINDS[device].cuda_api_shim
    if shim is None:
        return None
    if early := sorted(top for top in binds if top in sys.modules):
        raise RuntimeError(f"{shim} must be imported before {', '.join(early)} on {device}, which bound torch.cuda "
                           "names already (a forkserver that preloaded them?)")
    importlib.import_module(shim)
    return shim


def prepare_rank(device: str, local_rank: int, seed: int) -> Any:
    """Apply determinism settings, select this rank's card, seed; returns the torch.device."""
    import torch

    os.environ.update(DEVICE_KINDS[device].determinism_env)
    torch.manual_seed(seed)
    if device == "cpu":
        return torch.device("cpu")
    module = device_module(device)
    apply_precision_flags(device)
    module.set_device(local_rank)
    module.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.device(device, local_rank)


def synchronize(device: str) -> None:
    module = device_module(device) if device != "cpu" else None
    if module is not None:
        module.synchronize()


def peak_memory_bytes(device: str) -> int:
    """Peak device memory; on CPU the process's peak resident set size."""
    if device == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return int(device_module(device).max_memory_allocated())


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """One accelerator model, matched by a substring of the name its runtime reports (get_device_name())."""

    match: str
    peak_flops: dict[str, float] = field(default_factory=dict)
    """Dense peak FLOP/s of one card by run dtype (vendor datasheets, no sparsity); MFU is left out without it."""
    hbm_bytes: int | None = None
    """Memory of one visible card (an Atlas A3 910C shows as two 64 GiB dies, each one card); memory plans
    compare their per-rank estimate with it (harness/config/memory.py)."""


GIB = 2**30
# First match wins, so a more specific name comes before a shorter one that it contains.
DEVICE_MODELS: tuple[DeviceModel, ...] = (
    DeviceModel("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}, hbm_bytes=80 * GIB),
    DeviceModel("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, hbm_bytes=80 * GIB),
    DeviceModel("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, hbm_bytes=141 * 10**9),
    DeviceModel("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    # verl's GPU runner set L20x8 (the goldens workflow's default runner): 48 GB GDDR6 per card
    DeviceModel("L20", hbm_bytes=48 * GIB),
    DeviceModel("Ascend910B4", hbm_bytes=32 * GIB),
    DeviceModel("Ascend910B3", {"bf16": 313e12, "fp16": 313e12}, hbm_bytes=64 * GIB),
    DeviceModel("Ascend910B", hbm_bytes=64 * GIB),
    DeviceModel("Ascend910_93", hbm_bytes=64 * GIB),  # Atlas A3 (910C): one die per visible card
)


def device_model(name: str) -> DeviceModel | None:
    return next((model for model in DEVICE_MODELS if model.match in name), None)


def peak_flops(name: str, dtype: str) -> float | None:
    """Peak FLOP/s of one card of the named model at this dtype; None when unknown (CPU, an unlisted card)."""
    model = device_model(name)
    return model.peak_flops.get(dtype) if model else None
