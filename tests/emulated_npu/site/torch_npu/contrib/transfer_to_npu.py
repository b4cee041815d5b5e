"""Emulated torch_npu.contrib.transfer_to_npu.

The real module (Ascend/pytorch torch_npu/contrib/transfer_to_npu.py, `_init()`, run at import) moves CUDA code onto
the NPU by patching torch process-wide:
- `_patch_cuda`: `torch_npu._apply_patches([['cuda', torch_npu.npu], ['cuda.random', torch_npu.npu.random], ...])`,
  which (torch_npu/_init/patches, `_apply_patches`) sets `torch.cuda.<name> = torch_npu.npu.<name>` for every name
  in torch_npu.npu's `__all__` (and torch.cuda.random.<name> for torch_npu.npu.random's). Names outside `__all__`
  stay torch.cuda's own: notably `default_generators` (torch's empty tuple without CUDA), `_lazy_call` /
  `_lazy_init` (whose `is_initialized()` global is then torch_npu's), `nvtx`, `CUDAGraph`;
- the device arguments ('cuda', 'cuda:N', torch.device('cuda'), an int for `to`) of torch's factory functions
  (`torch_fn_white_list`), of `Tensor.to` / `new_*` / `pin_memory`, `Module.to` / `to_empty`, the torch.cuda
  functions of `torch_cuda_fn_white_list`, `torch.cuda.device`, `DeviceContext`, DDP, FSDP and
  `ProcessGroup._get_backend` become 'npu'; `Tensor.cuda` / `Module.cuda` are `.npu`, `Tensor.is_cuda` is `is_npu`,
  `torch.cuda.DoubleTensor` is `torch.npu.FloatTensor`;
- `init_process_group(backend='nccl')` becomes 'hccl', `is_nccl_available` is `is_hccl_available`;
- `torch.jit.script` / `script_method` return their argument, `torch.utils._triton.has_triton()` is False;
- torch.profiler's profile / schedule / ... are torch_npu.profiler's; `apis_config.json` wraps listed third-party
  functions so that they see CUDA's own `is_available`.

The emulation does that where emulated cards are on (`PARITY_EMULATED_NPU_CARDS` set: the CPU rehearsal of the
nightly's `device: npu` rows), over the emulated torch.npu (npu/__init__.py), whose 'npu' devices are the CPU
(_device.py). A name of torch_npu.npu's `__all__` the emulation does not implement becomes a REFUSING stand-in on
torch.cuda (EmulationRefused naming it), never CUDA's function and never a silent no-op; so do the profiler's
classes (no torch_npu.profiler here). `torch.cuda.default_generators` stays empty, as on the device, but says why
when indexed (MindSpeed replaces Megatron's `_set_cuda_rng_state` with one that reads torch.npu.default_generators,
mindspeed/core/megatron_basic/megatron_basic.py, for exactly this). `apis_config.json` (third-party package
versions) is not emulated: nothing here reads it.

Without emulated cards it patches nothing (`PATCHED` False): the emulated lane (device cpu, the Megatron engine's own
CPU shim) stays as it was. MindSpeed imports this module first thing (mindspeed/megatron_adaptor.py); the harness
imports it before an engine that calls torch.cuda by name (harness/config/devices.py DEVICE_KINDS['npu']).
"""
import functools
import os

import torch

from .. import npu as _npu
from ..emulation import EmulationRefused, refuse

#: torch_npu.npu.__all__ (Ascend/pytorch torch_npu/npu/__init__.py): the names `_patch_cuda` copies onto torch.cuda
NPU_ALL = (
    "is_initialized", "init", "set_dump", "synchronize", "device_count", "can_device_access_peer", "set_device",
    "current_device", "get_device_name", "get_device_properties", "get_device_capability", "mem_get_info",
    "is_available", "device", "device_of", "StreamContext", "stream", "set_stream", "current_stream",
    "default_stream", "set_sync_debug_mode", "get_sync_debug_mode", "init_dump", "utilization", "finalize_dump",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "caching_allocator_alloc",
    "caching_allocator_delete", "get_per_process_memory_fraction", "set_per_process_memory_fraction", "empty_cache",
    "empty_virt_addr_cache", "memory_stats", "memory_stats_as_nested_dict", "reset_accumulated_memory_stats",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached", "max_memory_cached",
    "memory_snapshot", "memory_summary", "MemPool", "use_mem_pool", "get_allocator_backend", "NPUPluggableAllocator",
    "change_current_allocator", "Stream", "Event", "set_option", "CubeMathType", "set_aoe", "set_compile_mode",
    "set_mm_bmm_format_nd", "get_mm_bmm_format_nd", "get_npu_overflow_flag", "clear_npu_overflow_flag",
    "stress_detect", "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "is_jit_compile_false", "get_amp_supported_dtype", "is_autocast_enabled", "is_bf16_supported",
    "set_autocast_enabled", "get_autocast_dtype", "set_autocast_dtype", "BoolStorage", "ByteStorage",
    "ShortStorage", "LongStorage", "IntStorage", "HalfStorage", "CharStorage", "DoubleStorage", "FloatStorage",
    "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor", "LongTensor",
    "ShortTensor", "BFloat16Tensor", "BFloat16Storage", "current_blas_handle", "stop_device", "restart_device",
    "check_uce_in_memory", "config", "matmul", "conv", "enable_deterministic_with_backward",
    "disable_deterministic_with_backward", "mstx", "SyncLaunchStream", "NPUGraph", "graph", "graph_pool_handle",
    "is_current_stream_capturing", "make_graphed_callables", "ExternalEvent", "graph_task_group_begin",
    "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end", "set_device_limit",
    "get_device_limit", "set_stream_limit", "reset_stream_limit", "get_stream_limit", "ipc_collect",
    "obfuscation_initialize", "obfuscation_finalize", "obfuscation_calculate", "set_op_timeout_ms",
    "host_empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "set_deterministic_level",
    "use_compatible_impl", "are_compatible_impl_enabled", "NpuGraphOpHandler", "register_npu_graph_handler",
    "super_kernel_scope_begin", "super_kernel_scope_end", "npurt",
)

#: the real module's white lists: whose device arguments it rewrites from cuda to npu
TORCH_FNS = ("logspace", "randint", "hann_window", "rand", "full_like", "ones_like", "rand_like", "randperm", "arange",
             "frombuffer", "normal", "_empty_per_channel_affine_quantized", "empty_strided", "empty_like",
             "scalar_tensor", "tril_indices", "bartlett_window", "ones", "sparse_coo_tensor", "randn", "kaiser_window",
             "tensor", "triu_indices", "as_tensor", "zeros", "randint_like", "full", "eye", "_sparse_csr_tensor_unsafe",
             "empty", "_sparse_coo_tensor_unsafe", "blackman_window", "zeros_like", "range", "sparse_csr_tensor",
             "randn_like", "from_file", "_cudnn_init_dropout_state", "_empty_affine_quantized", "linspace",
             "hamming_window", "empty_quantized", "_pin_memory", "autocast", "load", "Generator",
             "set_default_device")
TENSOR_FNS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros", "to", "pin_memory")
MODULE_FNS = ("to", "to_empty")
CUDA_FNS = ("get_device_properties", "get_device_name", "get_device_capability", "list_gpu_processes", "set_device",
            "synchronize", "mem_get_info", "memory_stats", "memory_summary", "memory_allocated",
            "max_memory_allocated", "reset_max_memory_allocated", "memory_reserved", "max_memory_reserved",
            "reset_max_memory_cached", "reset_peak_memory_stats")
DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id")
#: torch.profiler names `_patch_profiler` replaces with torch_npu.profiler's (no torch_npu.profiler here)
PROFILER_NAMES = ("profile", "schedule", "tensorboard_trace_handler", "ProfilerAction")

PATCHED = False
#: what was patched, for tests and the record: {"torch.cuda.<name>": "npu" | "refused"}
PATCHES: dict = {}


class Refused:
    """A torch.cuda name transfer_to_npu maps onto a torch_npu name the emulation does not implement: calling it,
    or reading an attribute of it, raises EmulationRefused naming both."""

    def __init__(self, name: str, target: str) -> None:
        self._name, self._target = name, target

    def _refuse(self):
        refuse(f"contrib.transfer_to_npu ({self._name} -> {self._target})", f"{self._target}")

    def __call__(self, *args, **kwargs):
        self._refuse()

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._refuse()

    def __enter__(self):
        self._refuse()

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return f"<refused by the emulated transfer_to_npu: {self._name} -> {self._target}>"


class _NoCudaGenerators(tuple):
    """torch.cuda.default_generators as on the device after transfer_to_npu: torch's own, empty (not in
    torch_npu.npu.__all__, and only CUDA's init fills it). Indexing it raises IndexError as the empty tuple does,
    with the reason."""

    def __getitem__(self, index):
        if not len(self):
            raise IndexError(
                f"torch.cuda.default_generators[{index!r}]: empty on an NPU: transfer_to_npu does not map it "
                "(Ascend/pytorch torch_npu/contrib/transfer_to_npu.py copies only torch_npu.npu.__all__, which lacks "
                "default_generators); the NPU's generators are torch.npu.default_generators (MindSpeed replaces "
                "Megatron's _set_cuda_rng_state with one that reads them: "
                "mindspeed/core/megatron_basic/megatron_basic.py). Emulated faithfully by tests/emulated_npu/site")
        return super().__getitem__(index)


def _to_npu(value, ints: bool):
    """One device argument, cuda -> npu, as the real `_replace_cuda_to_npu_in_list` / `_in_kwargs` do (an int only
    for `to` / `to_empty` positionally; always as a keyword)."""
    if isinstance(value, str) and "cuda" in value:
        return value.replace("cuda", "npu")
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("npu", value.index) if value.index is not None else torch.device("npu")
    if ints and isinstance(value, int) and not isinstance(value, bool):
        return f"npu:{value}"
    if isinstance(value, dict):
        return {(k.replace("cuda", "npu") if isinstance(k, str) else k):
                (v.replace("cuda", "npu") if isinstance(v, str) else v) for k, v in value.items()}
    return value


def _refuse_pinned(name):
    """Pinned host memory for the npu (Megatron: `torch.tensor(..., pin_memory=True).cuda(non_blocking=True)`,
    rope_utils.py get_pos_emb_on_this_cp_rank) needs the device's pinned allocator; the emulation's PrivateUse1 hooks
    have none (_device.py), and torch would fail with a message about its hooks interface: refused here instead."""
    refuse(f"contrib.transfer_to_npu ({name})", "pinned host memory for the npu (no pinned allocator)")


def _wrap_cuda(fn):
    if getattr(fn, "_emulated_transfer", False):
        return fn

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if kwargs.get("pin_memory") or fn.__name__ in ("pin_memory", "_pin_memory"):
            _refuse_pinned(fn.__name__)
        ints = fn.__name__ in ("to", "to_empty")
        args = tuple(_to_npu(a, ints) for a in args)
        for key in DEVICE_KWARGS:
            if kwargs.get(key) is not None:
                kwargs[key] = _to_npu(kwargs[key], True)
        if isinstance(kwargs.get("device_ids"), list):
            kwargs["device_ids"] = [_to_npu(d, ints) for d in kwargs["device_ids"]]
        return fn(*args, **kwargs)

    wrapped._emulated_transfer = True
    return wrapped


def _wrap_class(cls):
    """The real module wraps `torch.Generator` and `torch.autocast` in functions too; here they stay classes (a
    subclass whose constructor maps the device), because torch annotates with them at import
    (`torch.Generator | None`, torch/_inductor/decomposition.py) and a function there is a TypeError."""
    if getattr(cls, "_emulated_transfer", False):
        return cls
    if issubclass(cls, torch._C.Generator):
        def new(klass, device="cpu"):
            device = _to_npu(device, True)
            # the emulation's npu is the CPU (_device.py), and no generator is registered for its device type
            if isinstance(device, (str, torch.device)) and torch.device(device).type == "npu":
                device = "cpu"
            return torch._C.Generator.__new__(klass, device)

        body = {"__new__": new, "__init__": lambda self, device="cpu": None}
    else:
        body = {"__init__": _wrap_cuda(cls.__init__)}
    return type(cls.__name__, (cls,), {**body, "_emulated_transfer": True, "__module__": cls.__module__})


def _wrap_all(owner, names):
    for name in names:
        fn = getattr(owner, name, None)
        if fn is not None and not isinstance(fn, Refused):  # a refused name stays refused
            setattr(owner, name, _wrap_class(fn) if isinstance(fn, type) else _wrap_cuda(fn))


def _wrap_hccl(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        args = tuple(a.replace("nccl", "hccl") if isinstance(a, str) else a for a in args)
        if isinstance(kwargs.get("backend"), str):
            kwargs["backend"] = kwargs["backend"].replace("nccl", "hccl")
        return fn(*args, **kwargs)

    return wrapped


def _module_cuda(self, device=None):
    """Module.cuda = Module.npu: every parameter and buffer to the npu (here: where they are, the CPU)."""
    return self._apply(lambda t: t.npu(device))


def _patch_cuda():
    cuda = torch.cuda
    for name in NPU_ALL:
        if hasattr(_npu, name):
            setattr(cuda, name, getattr(_npu, name))
            PATCHES[f"torch.cuda.{name}"] = "npu"
        else:
            setattr(cuda, name, Refused(f"torch.cuda.{name}", f"torch_npu.npu.{name}"))
            PATCHES[f"torch.cuda.{name}"] = "refused"
    for name in _npu.random.__all__:
        setattr(cuda.random, name, getattr(_npu.random, name))
    # ['cuda.amp', torch_npu.npu.amp] and its submodules: torch_npu.npu.amp's autocast / custom_fwd / custom_bwd
    # are the 'npu' device type's (torch_npu/npu/amp/autocast_mode.py), which the emulation runs as CPU autocast
    # (_device.py); MindSpeed decorates its autograd Functions with torch.cuda.amp.custom_fwd at import
    # (e.g. mindspeed/core/tensor_parallel/tp_2d/layernorm_2d.py). The rest of torch.cuda.amp (GradScaler...) refuses
    amp = {"autocast": functools.partial(torch.autocast, "npu"),
           "custom_fwd": functools.partial(torch.amp.custom_fwd, device_type="npu"),
           "custom_bwd": functools.partial(torch.amp.custom_bwd, device_type="npu")}
    for name in [n for n in dir(cuda.amp) if not n.startswith("_")]:
        if name in amp:
            setattr(cuda.amp, name, amp[name])
            PATCHES[f"torch.cuda.amp.{name}"] = "npu"
        elif callable(getattr(cuda.amp, name)) and not isinstance(getattr(cuda.amp, name), type(os)):
            setattr(cuda.amp, name, Refused(f"torch.cuda.amp.{name}", f"torch_npu.npu.amp.{name}"))
            PATCHES[f"torch.cuda.amp.{name}"] = "refused"
    cuda.default_generators = _NoCudaGenerators()


def _init():
    global PATCHED
    _patch_cuda()
    _wrap_all(torch.cuda, CUDA_FNS)
    # torch.cuda.device is torch_npu.npu.device by now (it is in __all__); the real module wraps its __init__
    for name in PROFILER_NAMES:
        setattr(torch.profiler, name, Refused(f"torch.profiler.{name}", f"torch_npu.profiler.{name}"))
        PATCHES[f"torch.profiler.{name}"] = "refused"
    _wrap_all(torch, TORCH_FNS)
    torch.UntypedStorage.__new__ = _wrap_cuda(torch.UntypedStorage.__new__)
    _wrap_all(torch.Tensor, TENSOR_FNS)
    torch.Tensor.cuda = torch.Tensor.npu
    # Tensor.is_cuda is is_npu on the device: every emulated npu tensor is a CPU tensor, so it answers False here
    torch.Tensor.is_cuda = property(lambda self: self.device.type == "npu")
    torch.cuda.DoubleTensor = Refused("torch.cuda.DoubleTensor", "torch_npu.npu.FloatTensor")
    _wrap_all(torch.nn.Module, MODULE_FNS)
    torch.nn.Module.cuda = _module_cuda
    dist = torch.distributed
    dist.init_process_group = _wrap_hccl(dist.init_process_group)
    dist.is_nccl_available = lambda: True  # is_hccl_available: the emulated hccl backend is registered (_hccl.py)
    dist.ProcessGroup._get_backend = _wrap_cuda(dist.ProcessGroup._get_backend)
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp1
    fsdp1.FullyShardedDataParallel.__init__ = _wrap_cuda(fsdp1.FullyShardedDataParallel.__init__)
    torch.nn.parallel.DistributedDataParallel.__init__ = _wrap_cuda(torch.nn.parallel.DistributedDataParallel.__init__)
    torch.utils._device.DeviceContext.__init__ = _wrap_cuda(torch.utils._device.DeviceContext.__init__)
    # the real module disables TorchScript (it does not support it) and triton
    torch.jit.script = lambda obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None: obj
    torch.jit.script_method = lambda fn: fn
    torch.utils._triton.has_triton = lambda: False
    # UninitializedTensorMixin keeps a list of allowed methods holding the original Tensor.to
    from torch.nn.parameter import UninitializedTensorMixin
    allowed = UninitializedTensorMixin._allowed_methods
    for index, method in enumerate(allowed):
        if getattr(method, "__name__", "") == "to":
            allowed[index] = torch.Tensor.to
            break
    PATCHED = True


if _npu.emulated_cards():
    _init()

__all__ = ["EmulationRefused"]
