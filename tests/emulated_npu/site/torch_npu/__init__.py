"""EMULATED torch_npu: a CPU stand-in for the Ascend PyTorch adapter, for running the real MindSpeed source in tests.

What it is
- The import-time API MindSpeed touches (contrib.transfer_to_npu, _C, unsupported_dtype, npu.*, utils.*) and the
  fused ops it calls, written as plain-torch REFERENCE implementations of each op's documented contract
  (CANN torch_npu API reference; MindSpeed docs). Every op counts its calls: `torch_npu.emulation.call_counts()`.
- `EMULATED = True` marks it; `__version__` ends in "+emulated".

What it is not
- Not a device: tensors stay CPU tensors (a `device='npu'` keyword or `.to('npu')` lands on the CPU: _device.py,
  a TorchFunctionMode entered at import); `torch.npu` (set on import, as the real package does) reports no device
  (`is_available()` False), its streams/events are no-ops, `transfer_to_npu` patches nothing. With
  `PARITY_EMULATED_NPU_CARDS=N` set, `torch.npu` reports N emulated cards (npu/__init__.py; ASCEND_RT_VISIBLE_DEVICES
  honoured) so that `device: npu` rows (`--parity-device npu`) run on CPU tensors; the C++ accelerator hooks still
  say unavailable, so torch's accelerator stays the CPU.
- Not the kernels: numerics are fp32 references (no bf16 accumulation, no inner_precise), no dropout.
- Not HCCL: the torch.distributed backend 'hccl' it registers (_hccl.py) is gloo behind the checks of what HCCL on
  Atlas A2/A3 refuses (a float64 reduction, prod on bf16, ...): it raises where the device would fail, and otherwise
  gives gloo's results.
- Anything it does not implement is REFUSED: unimplemented arguments raise NotImplementedError
  (`emulation.EmulationRefused`), mask/sparse_mode contract violations raise AssertionError, and unknown
  attributes raise AttributeError, so `hasattr` probes (e.g. MindSpeed's probe for
  `npu_moe_token_permute_with_routing_map`, mindspeed/features_manager/fusions/fused_moe_permute.py) see the op as
  absent and MindSpeed takes its fallback path (Megatron's permute).

It lives under tests/emulated_npu/site (no __init__.py there) and is importable only when that folder is put on
PYTHONPATH explicitly.
"""
import torch
import torch._dynamo  # imported by the real torch_npu at load (torch_npu/utils/_dynamo.py) to patch it

from . import _C, _attention, _device, _hccl, _ops, contrib, emulation, npu, utils  # noqa: F401
from .emulation import EMULATED, call_counts, counted, reset_counts  # noqa: F401 - the public names

# the torch_npu line of verl's current Ascend image (`latest-vllm-910b-ubuntu`, verl docker/ascend/
# Dockerfile.ascend_9.1.0_a2 pins torch 2.10.0; torch_npu comes with vllm-ascend's requirements, 2.10.0.postN):
# ci/check_ascend_stack.py compares it with the Dockerfile (tests/unit/test_ascend_stack.py)
__version__ = "2.10.0+emulated"

# the real torch_npu lists the dtypes HCCL cannot carry (mindspeed/core/multi_modal/dist_train/dist_communication.py)
unsupported_dtype = [torch.quint8, torch.quint4x2, torch.quint2x4, torch.qint32, torch.qint8]

_OPS = {
    "npu_fusion_attention": _attention.npu_fusion_attention,
    "npu_fusion_attention_grad": _attention.npu_fusion_attention_grad,
    "npu_rms_norm": _ops.npu_rms_norm,
    "npu_swiglu": _ops.npu_swiglu,
    "npu_rotary_mul": _ops.npu_rotary_mul,
    "npu_rotary_position_embedding": _ops.npu_rotary_position_embedding,
    "npu_grouped_matmul": _ops.npu_grouped_matmul,
    "npu_moe_token_permute": _ops.npu_moe_token_permute,
    "npu_moe_token_unpermute": _ops.npu_moe_token_unpermute,
    "npu_format_cast": _ops.npu_format_cast,
    "get_npu_format": _ops.get_npu_format,
    "npu_dtype_cast": _ops.npu_dtype_cast,
}
for _name, _fn in _OPS.items():
    globals()[_name] = counted(_name)(_fn)
IMPLEMENTED_OPS = tuple(_OPS)
del _name, _fn

# 'npu' as a device type and torch.npu as its device module, as the real torch_npu installs them
# (torch_npu/__init__.py: rename_privateuse1_backend + _register_device_module): torch FSDP / DeviceMesh build
# torch.device('npu', torch.npu.current_device()) for an 'npu' mesh. No kernels are registered for the device:
# _device.py maps every 'npu' device to the CPU before dispatch.
if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")
    _device.register_hooks()
if getattr(torch, "npu", None) is not npu:
    if hasattr(torch, "npu"):
        delattr(torch, "npu")
    torch._register_device_module("npu", npu)
# device='npu' -> CPU for the rest of the process (_device.py)
_device.install()
# the 'hccl' torch.distributed backend, as the real torch_npu registers it at import (_hccl.py)
_hccl.register()


def __getattr__(name):
    raise AttributeError(f"module 'torch_npu' (CPU emulation, tests/emulated_npu/site) has no attribute {name!r}: "
                         f"not emulated (implemented ops: {', '.join(IMPLEMENTED_OPS)})")
