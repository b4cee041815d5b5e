"""Emulated torch_npu.utils.collect_env (imported at module load by MindSpeed's MoE token dispatchers,
mindspeed/core/transformer/moe/legacy_a2a_token_dispatcher.py and moe_feature/overlap/token_dispatcher.py, which
compare the version against a list at import)."""


def get_cann_version():
    """What torch_npu's own function returns when no `ascend_*_install.info` lies under $ASCEND_HOME_PATH:
    'not known' (torch_npu/utils/collect_env.py get_cann_version). There is no CANN install here."""
    return "not known"
