"""Emulated torch_npu.npu.memory: custom allocators are refused (there is no device memory)."""
from ..emulation import refuse


class NPUPluggableAllocator:
    def __init__(self, *args, **kwargs):
        refuse("npu.memory.NPUPluggableAllocator", "pluggable allocators")


def change_current_allocator(allocator):
    refuse("npu.memory.change_current_allocator", "pluggable allocators")
