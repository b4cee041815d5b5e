"""Emulated `torch_npu.npu` (also installed as `torch.npu`, as the real torch_npu does).

There is no device: tensors stay on CPU. `is_available()` is False and `device_count()` is 0 (the harness reads
`torch_npu.EMULATED` instead). Streams and events are no-ops, which is exact on CPU, where every op is synchronous.
`current_device()` returns the index 0, as the real one returns an int: torch FSDP builds
torch.device('npu', current_device()) for an 'npu' mesh; MindSpeed's `torch.tensor(..., device=
torch.npu.current_device())` (e.g. ring_context_parallel.py compute_qkv_index) lands on the CPU through _device.py.
`default_generators` is (torch.default_generator,): MindSpeed's rng-state setter
(mindspeed/core/megatron_basic/megatron_basic.py _set_cuda_rng_state) indexes it.
"""
import contextlib

import torch

from ..emulation import refuse
from . import memory  # noqa: F401  (torch_npu.npu.memory.*)


def is_available():
    return False


def is_initialized():
    return True


def init():
    return None


def device_count():
    return 0


def current_device():
    return 0


def set_device(device):
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


class _Generators(tuple):
    """(torch.default_generator,), also indexed by what `current_device()` returns here (torch.device('cpu')):
    MindSpeed indexes it with `torch.cuda.current_device()`, which the CPU shim of the Megatron engine answers
    with torch.device('cpu') (engines/megatron/cpu_compat.py)."""

    def __getitem__(self, index):
        if isinstance(index, torch.device):
            if index.type != "cpu":
                refuse("npu.default_generators", f"index {index!r}")
            index = 0
        return super().__getitem__(index)


default_generators = _Generators((torch.default_generator,))


def _lazy_call(callable, **kwargs):
    """Real torch_npu defers the call until the device is initialised; the emulation is always initialised."""
    callable()


@contextlib.contextmanager
def device(dev):
    yield


# --- memory: there is no device memory ----------------------------------------------------------------------------
def memory_allocated(device=None):
    return 0


def max_memory_allocated(device=None):
    return 0


def memory_reserved(device=None):
    return 0


def max_memory_reserved(device=None):
    return 0


def reset_max_memory_allocated(device=None):
    return None


def reset_peak_memory_stats(device=None):
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
