"""Emulated torch_npu.utils.collect_env (imported at module load by MindSpeed's MoE token dispatchers,
mindspeed/core/transformer/moe/legacy_a2a_token_dispatcher.py)."""
from ..emulation import refuse


def get_cann_version():
    refuse("utils.collect_env.get_cann_version", "a CANN version (there is no CANN)")
