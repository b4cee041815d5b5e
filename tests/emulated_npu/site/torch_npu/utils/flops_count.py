"""Emulated torch_npu.utils.flops_count (imported by mindspeed/functional/tflops_calculate/tflops_utils.py)."""
from ..emulation import refuse


class FlopsCounter:
    def __init__(self, *args, **kwargs):
        refuse("utils.flops_count.FlopsCounter", "device FLOP counting")
