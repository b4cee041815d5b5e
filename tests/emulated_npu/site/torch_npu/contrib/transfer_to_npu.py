"""Emulated torch_npu.contrib.transfer_to_npu.

The real module rewrites `torch.cuda.*`, `device='cuda'` and friends to the NPU. The emulation has no device type:
tensors stay on CPU, so it deliberately patches nothing (`PATCHED` is False). MindSpeed imports it first thing
(mindspeed/megatron_adaptor.py: `from torch_npu.contrib import transfer_to_npu`).
"""
PATCHED = False
