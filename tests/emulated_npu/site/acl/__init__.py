"""Stub `acl` (pyACL, CANN's Python runtime API) for the emulated torch_npu.

MindSpeed's MoE modules import it at module load (mindspeed/core/transformer/moe/moe_feature/overlap/
moe_layer_overlap_allgather.py, reached from the grouped-GEMM feature, mindspeed/features_manager/moe/gmm.py) and
call `acl.get_soc_name()` inside overlap features to branch on the chip; the memory features call
`acl.rt.get_mem_info`. The SoC name is as neutral as `torch_npu.npu.get_device_name()`; nothing that would read a
device (memory, streams) is emulated.
"""
from torch_npu.emulation import refuse

EMULATED = True


def get_soc_name():
    return "Emulated-NPU (CPU)"


class rt:  # the module path MindSpeed calls (acl.rt.get_mem_info)
    """acl.rt: the runtime API; no device memory to report."""

    @staticmethod
    def get_mem_info(attr):
        refuse("acl.rt.get_mem_info", "device memory info (there is no device)")
