"""'npu' devices on CPU: the emulation registers 'npu' as a device type (as the real torch_npu does) but no
kernels for it, and MindSpeed and torch FSDP create tensors on it (`device='npu'`, e.g.
mindspeed/te/pytorch/module/layernorm_column_parallel_linear.py, grouped_linear.py,
core/transformer/flash_attention/generate_mask/generate_mask.py; FSDP on an 'npu' mesh). This TorchFunctionMode,
entered when the emulated torch_npu is imported (so only where the emulation is on the path: the emulated lane),
maps a `device` keyword or a `.to(...)` target naming an npu device (string, torch.device or index) to the CPU,
and makes `tensor.npu()` a no-op.
"""
import torch
from torch.overrides import TorchFunctionMode


def _is_npu(device):
    """'npu', 'npu:N', torch.device('npu', N), or a bare index N (an index names the current accelerator, which
    in the lane is the emulated NPU: `torch.npu.current_device()` returns one, as the real one does)."""
    if isinstance(device, str):
        return device == "npu" or device.startswith("npu:")
    if isinstance(device, torch.device):
        return device.type == "npu"
    return isinstance(device, int) and not isinstance(device, bool)


#: ops whose NPU kernels take int32 indices where the CPU kernels insist on int64 (MindSpeed FSDP's eager MoE
#: unpermute, mindspeed/fsdp/distributed/expert_parallel/utils.py, index_copy_s with int32 sort indices)
_INT32_INDEX_OPS = frozenset({"index_copy", "index_copy_"})


class NpuToCpuMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if _is_npu(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        if name == "to" and any(_is_npu(a) for a in args[1:]):
            args = tuple("cpu" if i and _is_npu(a) else a for i, a in enumerate(args))
        if name in _INT32_INDEX_OPS and len(args) > 2 and getattr(args[2], "dtype", None) == torch.int32:
            args = (*args[:2], args[2].long(), *args[3:])
        return func(*args, **kwargs)


def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    return self


MODE = NpuToCpuMode()


def install():
    if not hasattr(torch.Tensor, "npu"):
        torch.Tensor.npu = _tensor_npu
    MODE.__enter__()
    _fsdp_on_cpu()
    _backward_under_the_mode()
    _autocast_on_cpu()


def _fsdp_on_cpu():
    """torch FSDP2 takes its compute device from the mesh (torch.device('npu', torch.npu.current_device()) for
    MindSpeed's 'npu' mesh) and asserts every parameter is already there; here every 'npu' tensor IS a CPU tensor,
    so for an 'npu' mesh that device is the CPU. The one place the emulation reaches into torch itself."""
    from torch.distributed._composable import replicate_with_fsdp
    from torch.distributed.fsdp._fully_shard import _fully_shard

    for module in (_fully_shard, replicate_with_fsdp):
        real = module._get_device_from_mesh
        if getattr(real, "emulated", False):
            continue

        def device_from_mesh(mesh, real=real):
            return torch.device("cpu") if mesh.device_type == "npu" else real(mesh)

        device_from_mesh.emulated = True
        module._get_device_from_mesh = device_from_mesh


def _backward_under_the_mode():
    """A graph's Python backward code (custom autograd Functions, hooks) runs inside `loss.backward()`, which the
    mode's handler runs with the mode popped, as it runs every function it intercepts: MindSpeed FSDP's expert
    all-to-all backward (mindspeed/fsdp/distributed/dist_ops.py `_AllToAll`) would then allocate on
    `torch.accelerator.current_device_index()`, an 'npu' index, unmapped. The one call that runs the autograd engine
    for `Tensor.backward`, `torch.autograd.backward` and `torch.autograd.grad` (`torch.autograd.graph.
    _engine_run_backward`, the hook torch.compiler patches the same way) runs with the mode pushed again, so the
    backward maps 'npu' devices as the forward does."""
    import torch.autograd
    import torch.autograd.graph

    real = torch.autograd.graph._engine_run_backward
    if getattr(real, "emulated", False):
        return

    def engine_run_backward(*args, **kwargs):
        if MODE in torch.overrides._get_current_function_mode_stack():
            return real(*args, **kwargs)
        with MODE:
            return real(*args, **kwargs)

    engine_run_backward.emulated = True
    torch.autograd.graph._engine_run_backward = engine_run_backward
    torch.autograd._engine_run_backward = engine_run_backward


def _autocast_on_cpu():
    """`torch.autocast('npu', ...)` is CPU autocast, as every 'npu' tensor is a CPU tensor: an 'npu' autocast would
    set the PrivateUse1 autocast state, which no CPU op reads, so a bf16 run's autocast regions would compute in fp32
    without a word (the hf engine's `torch.autocast(device_type=ctx.device.type, ...)`, engines/hf/common.py). CPU
    autocast casts its own op list (torch/amp/autocast_mode.py; torch_npu's list differs): the emulation runs
    bf16 autocast, not the device's."""
    from torch.amp import autocast_mode

    real = autocast_mode.autocast.__init__
    if getattr(real, "emulated", False):
        return

    def init(self, device_type, *args, **kwargs):
        return real(self, "cpu" if device_type == "npu" else device_type, *args, **kwargs)

    init.emulated = True
    autocast_mode.autocast.__init__ = init


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """The device's C++ hooks, as torch_npu registers them: here an NPU that is not available, so that
    torch._C._get_accelerator() (dist.barrier) answers 'cpu' and torch.accelerator.is_available() is False."""

    def is_available(self):
        return False

    def has_primary_context(self, device_index):
        return False

    def is_built(self):
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register_hooks():
    """Once per process, right after 'npu' becomes the name of the PrivateUse1 device type."""
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
