"""Emulated torch_npu._C: only the HCCL process-group options class MindSpeed probes.

mindspeed/functional/profiler/profiler_info.py probes `hasattr(ProcessGroupHCCL.Options, 'hccl_config')`;
mindspeed/core/parallel_state.py builds Options() only with --hccl-group-buffer. There is no HCCL: constructing
Options is refused.
"""
import types

from ..emulation import refuse


class _HCCLOptions:
    def __init__(self, *args, **kwargs):
        refuse("_C._distributed_c10d.ProcessGroupHCCL.Options", "HCCL process-group options (no HCCL on CPU)")


class ProcessGroupHCCL:
    Options = _HCCLOptions


_distributed_c10d = types.SimpleNamespace(ProcessGroupHCCL=ProcessGroupHCCL)
