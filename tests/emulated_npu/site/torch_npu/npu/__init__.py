"""Emulated `torch_npu.npu` (also installed as `torch.npu`, as the real torch_npu does).

There is no device: tensors stay on CPU. By default `is_available()` is False and `device_count()` is 0 (the
harness reads `torch_npu.EMULATED` instead). Streams and events are no-ops, which is exact on CPU, where every op is
synchronous.
`current_device()` returns an index, as the real one returns an int: torch FSDP builds
torch.device('npu', current_device()) for an 'npu' mesh; MindSpeed's `torch.tensor(..., device=
torch.npu.current_device())` (e.g. ring_context_parallel.py compute_qkv_index) lands on the CPU through _device.py.
`default_generators` is (torch.default_generator,): MindSpeed's rng-state setter
(mindspeed/core/megatron_basic/megatron_basic.py _set_cuda_rng_state) indexes it.

Emulated cards: with `PARITY_EMULATED_NPU_CARDS=N` in the environment (N >= 1; the CPU rehearsal of the nightly
sets it to its runner set's card count), `is_available()` answers True and `device_count()` N, or the number of ids
`ASCEND_RT_VISIBLE_DEVICES` lists (each below N, as the real runtime numbers the visible cards 0..k-1), so that a
`device: npu` row runs on CPU tensors over the emulated HCCL group (_hccl.py): set_device checks the index, the
precision flags `matmul.allow_hf32` / `conv.allow_hf32` exist (False only: the emulation computes fp32 in fp32),
memory figures are the host process's (its tensors are host tensors: the numbers the CPU lane records). The C++
accelerator hooks still say unavailable (_device.py), which keeps torch's accelerator, and every tensor, on the CPU.
Without the variable nothing here changes.
"""
import contextlib
import os
import resource

import torch

from ..emulation import refuse
from . import memory  # noqa: F401  (torch_npu.npu.memory.*)

#: the environment variable that turns the emulated cards on (module docstring)
CARDS_ENV = "PARITY_EMULATED_NPU_CARDS"
VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"


def emulated_cards() -> int:
    """The number of cards this process sees: 0 without PARITY_EMULATED_NPU_CARDS; N, or the ids
    ASCEND_RT_VISIBLE_DEVICES lists (refused when one is not below N, repeats, or is not an int)."""
    value = os.environ.get(CARDS_ENV, "").strip()
    if not value:
        return 0
    if not value.isdigit() or int(value) < 1:
        refuse("npu", f"{CARDS_ENV}={value!r} (a positive card count)")
    total = int(value)
    visible = os.environ.get(VISIBLE_ENV)
    if visible is None:
        return total
    ids = [item.strip() for item in visible.split(",")]
    if not all(item.isdigit() and int(item) < total for item in ids) or len(set(ids)) != len(ids):
        refuse("npu", f"{VISIBLE_ENV}={visible!r} with {CARDS_ENV}={total} (distinct card ids below {total})")
    return len(ids)


_CURRENT = [0]


def is_available():
    return emulated_cards() > 0


def is_initialized():
    return True


def init():
    return None


def device_count():
    return emulated_cards()


def current_device():
    return _CURRENT[0]


def _index(device) -> int:
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            refuse("npu.set_device", f"device {device!r}")
        return device.index if device.index is not None else _CURRENT[0]
    return int(device)


def set_device(device):
    if not emulated_cards():
        return None
    index = _index(device)
    if not 0 <= index < emulated_cards():
        refuse("npu.set_device", f"card {index} of {emulated_cards()} emulated cards")
    _CURRENT[0] = index
    return None


def get_device_name(device=None):
    # MindSpeed tests "Ascend910_95" / "Ascend950" in this name (mindspeed/ops/triton/utils.py): keep it neutral.
    return "Emulated-NPU (CPU)"


def get_device_properties(device=None):
    refuse("npu.get_device_properties", "device properties (there is no device)")


def synchronize(device=None):
    return None


def set_compile_mode(jit_compile=False):
    return None


def manual_seed(seed):
    """The emulated device generator IS the CPU generator."""
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed):
    manual_seed(seed)


class _Hf32Flag:
    """`torch.npu.matmul` / `torch.npu.conv`: `allow_hf32` (HF32, Ascend's TF32; torch_npu API reference
    torch_npu.npu.matmul.allow_hf32 / torch_npu.npu.conv.allow_hf32). The emulation computes fp32 in fp32, so only
    False is emulated; True is refused rather than pretended."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def allow_hf32(self) -> bool:
        return False

    @allow_hf32.setter
    def allow_hf32(self, value: bool) -> None:
        if value:
            refuse(f"npu.{self._name}.allow_hf32", "HF32 (the emulation computes fp32 in fp32)")


matmul = _Hf32Flag("matmul")
conv = _Hf32Flag("conv")


class _Generators(tuple):
    """(torch.default_generator,), also indexed by what `current_device()` returns here (torch.device('cpu')):
    MindSpeed indexes it with `torch.cuda.current_device()`, which the CPU shim of the Megatron engine answers
    with torch.device('cpu') (engines/megatron/cpu_compat.py)."""

    def __getitem__(self, index):
        if isinstance(index, torch.device):
            if index.type != "cpu":
                refuse("npu.default_generators", f"index {index!r}")
            index = 0
        if isinstance(index, int) and 0 < index < emulated_cards():
            index = 0  # every emulated card draws from the one CPU generator
        return super().__getitem__(index)


default_generators = _Generators((torch.default_generator,))


def _lazy_call(callable, **kwargs):
    """Real torch_npu defers the call until the device is initialised; the emulation is always initialised."""
    callable()


@contextlib.contextmanager
def device(dev):
    yield


# --- memory: there is no device memory; emulated cards report the host process's -----------------------------
def _host_bytes() -> int:
    with open("/proc/self/statm") as statm:  # resident pages, second field
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _host_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_allocated(device=None):
    return _host_bytes() if emulated_cards() else 0


def max_memory_allocated(device=None):
    return _host_peak_bytes() if emulated_cards() else 0


def memory_reserved(device=None):
    return memory_allocated(device)


def max_memory_reserved(device=None):
    return max_memory_allocated(device)


def reset_max_memory_allocated(device=None):
    if emulated_cards():  # the host's peak resident set cannot be reset
        refuse("npu.reset_max_memory_allocated", "resetting the peak on emulated cards")
    return None


def reset_peak_memory_stats(device=None):
    if emulated_cards():
        refuse("npu.reset_peak_memory_stats", "resetting the peak on emulated cards")
    return None


def memory_stats(device=None):
    return {}


def empty_cache():
    return None


def mem_get_info(device=None):
    refuse("npu.mem_get_info", "device memory info (there is no device)")


def set_option(option):
    return None


# --- streams / events: no-ops, exact on CPU --------------------------------------------------------------------
class Stream:
    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, stream):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def synchronize(self):
        return None

    def query(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Stream)

    def __hash__(self):
        return 0


_DEFAULT_STREAM = Stream()


def current_stream(device=None):
    return _DEFAULT_STREAM


def default_stream(device=None):
    return _DEFAULT_STREAM


@contextlib.contextmanager
def stream(s):
    yield


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing

    def record(self, stream=None):
        return None

    def wait(self, stream=None):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True

    def elapsed_time(self, end_event):
        refuse("npu.Event.elapsed_time", "device timing")


class mstx:
    """Profiler range markers: no-ops (MindSpeed patches torch.cuda.nvtx.range_push/pop with these,
    mindspeed/features_manager/megatron_basic/requirements_basic.py)."""

    @staticmethod
    def range_start(message, stream=None):
        return 0

    @staticmethod
    def range_end(range_id=None):
        return None

    @staticmethod
    def mark(message, stream=None):
        return None


# torch_npu.npu.random.* and its names here, as torch_npu/npu/__init__.py re-exports them (`from .random import *`):
# transfer_to_npu maps torch.cuda.random and torch.cuda.get_rng_state & co. onto them
from . import random  # noqa: E402

get_rng_state, set_rng_state = random.get_rng_state, random.set_rng_state
get_rng_state_all, set_rng_state_all = random.get_rng_state_all, random.set_rng_state_all
seed, seed_all, initial_seed = random.seed, random.seed_all, random.initial_seed
