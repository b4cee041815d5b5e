"""Emulated torch_npu.utils."""
from ..emulation import refuse


def register_asd_hook(*args, **kwargs):
    # mindspeed/core/fusions/rms_norm.py calls it only under silent-data-corruption detection.
    refuse("utils.register_asd_hook", "silent-data-corruption (ASD) hooks")
