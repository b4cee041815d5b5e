"""'npu' device strings on CPU: the emulation has no device type, but MindSpeed creates tensors with
`device='npu'` (e.g. mindspeed/te/pytorch/module/layernorm_column_parallel_linear.py, grouped_linear.py,
core/transformer/flash_attention/generate_mask/generate_mask.py). This TorchFunctionMode, entered when the
emulated torch_npu is imported (so only where the emulation is on the path: the emulated lane), maps a `device`
keyword or a `.to(...)` target naming 'npu' / 'npu:N' to the CPU, and makes `tensor.npu()` a no-op.
"""
import torch
from torch.overrides import TorchFunctionMode


def _is_npu(device):
    if isinstance(device, str):
        return device == "npu" or device.startswith("npu:")
    return False


class NpuToCpuMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_npu(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        if getattr(func, "__name__", "") == "to" and any(_is_npu(a) for a in args[1:]):
            args = tuple("cpu" if i and _is_npu(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    return self


MODE = NpuToCpuMode()


def install():
    if not hasattr(torch.Tensor, "npu"):
        torch.Tensor.npu = _tensor_npu
    MODE.__enter__()
