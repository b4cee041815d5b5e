"""EMULATED HCCL: the torch.distributed backend named 'hccl', as the real torch_npu registers it
(torch_npu/__init__.py: `torch.distributed.Backend.register_backend("hccl", ..., extended_api=True,
devices=["npu"])`), here a Python ProcessGroup (the pattern of torch's test/distributed/test_c10d_pypg.py and
torch/testing/_internal/distributed/multi_threaded_pg.py) that checks each collective against what HCCL on Atlas A2 /
A3 accepts and then hands it to gloo. Gloo computes every result: what passes the checks gives gloo's numbers.

It claims the 'cpu' device as well as 'npu': the emulation's 'npu' tensors ARE CPU tensors (_device.py), so every
collective of a `init_process_group("hccl")` run, and of every group made from it, passes through these checks.

Refused, as the device refuses (`HcclRefused`, a RuntimeError like torch_npu's TORCH_CHECK, naming the op, the dtype and
the source):
- reductions (allreduce, reduce_scatter, reduce): int8, int16, int32, int64, float16, float32, bfloat16 only; `prod`
  not for int16 / bfloat16; ReduceOp BAND / BOR / BXOR / PREMUL_SUM refused, AVG accepted (torch_npu sums then
  divides). [AR] [RS] [PTA]
- data movement (allgather, broadcast, scatter, alltoall(v), send / recv): uint8, int8, int16, int32, int64,
  float16, float32, float64, bfloat16, and bool (which torch_npu carries as uint8). HCCL also lists uint16 / uint32 /
  uint64, but torch_npu maps no torch dtype to them, so they are refused (`Unsupported data type for HCCL process
  group`); complex dtypes reach no backend (torch's Python layer views them as real). [AG] [BC] [SC] [A2A] [SR] [PTA]
- gather: torch_npu's ProcessGroupHCCL::gather throws "ProcessGroupHCCL does not support gather" [PTA].
Sources (CANN HCCL API reference, 8.5.0, Atlas A2 / A3 rows of each dataType parameter):
- [AR] HcclAllReduce hiascend.com/document/detail/zh/CANNCommunityEdition/850/API/hcclapiref/hcclcpp_07_0020.html
  ("prod" 操作不支持int16、bfp16数据类型)
- [RS] HcclReduceScatter hiascend.com/document/detail/zh/canncommercial/850/API/hcclapiref/hcclcpp_07_0024.html
- [AG] HcclAllGather hiascend.com/doc_center/source/en/CANNCommunityEdition/850/API/hcclapiref/hcclcpp_07_0023.html
- [BC] HcclBroadcast hiascend.com/document/detail/zh/CANNCommunityEdition/850/API/hcclapiref/hcclcpp_07_0022.html
- [SC] HcclScatter hiascend.com/doc_center/source/en/CANNCommunityEdition/850/API/hcclapiref/hcclcpp_07_0029.html
- [A2A] HcclAlltoAll hiascend.com/document/detail/zh/canncommercial/850/API/hcclapiref/hcclcpp_07_0026.html (the
  alltoall(v) paths of torch_npu use HcclAlltoAllV, whose page was not checked: the AlltoAll list is assumed)
- [SR] HcclSend / HcclRecv hiascend.com/document/detail/en/CANNCommunityEdition/850/API/hcclapiref/hcclcpp_07_0032.html
- [PTA] torch_npu (github.com/Ascend/pytorch) torch_npu/csrc/distributed/HCCLUtils.cpp kScalarTypeToHcclDataType,
  ProcessGroupHCCL.cpp getHcclReduceOp / checkSupportedDataType (the reductions' list, the same as [AR]), gather
- HcclReduce's A2 / A3 page was not checked: the reduction list of [AR] / [RS] is assumed.

Not implemented, REFUSED (`emulation.EmulationRefused`): recv from any source, monitored_barrier, splitting /
merging groups, process-group options, and any op not defined here (torch's ProcessGroup base then finds no
backend for the CPU tensor and raises).
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ProcessGroupGloo, ReduceOp

from .emulation import refuse

BACKEND = "hccl"
SOURCE = "CANN HCCL API reference (Atlas A2/A3 dataType lists) and torch_npu ProcessGroupHCCL; tests/emulated_npu/" \
         "site/torch_npu/_hccl.py"

REDUCE_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                           torch.bfloat16})
MOVE_DTYPES = frozenset({torch.uint8, torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                         torch.float32, torch.float64, torch.bfloat16})
PROD_REFUSED = frozenset({torch.int16, torch.bfloat16})
REDUCE_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
              ReduceOp.AVG: "avg"}


class HcclRefused(RuntimeError):
    """HCCL on Atlas A2 / A3 (or torch_npu in front of it) refuses this collective: the real run would fail here."""


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensors(nested) -> list[torch.Tensor]:
    out = []
    for item in nested:
        out += _tensors(item) if isinstance(item, (list, tuple)) else [item]
    return out


def check_movement(op: str, tensors) -> None:
    for tensor in _tensors(tensors):
        if tensor.dtype not in MOVE_DTYPES:
            raise HcclRefused(f"emulated HCCL {op}: dtype {_name(tensor.dtype)} is refused on Atlas A2/A3 (carried: "
                              f"{', '.join(sorted(map(_name, MOVE_DTYPES)))}; {SOURCE})")


def check_reduction(op: str, tensors, reduce_op) -> None:
    kind = next((name for value, name in REDUCE_OPS.items() if reduce_op == value), None)
    if kind is None:
        name = getattr(reduce_op, "op", reduce_op)
        raise HcclRefused(f"emulated HCCL {op}: ReduceOp {name} is refused (HCCL reduces with sum, prod, max, min; "
                          f"torch_npu adds avg as sum then divide; {SOURCE})")
    for tensor in _tensors(tensors):
        if tensor.dtype not in REDUCE_DTYPES:
            raise HcclRefused(f"emulated HCCL {op}: dtype {_name(tensor.dtype)} is refused for a reduction on Atlas "
                              f"A2/A3 (reduces: {', '.join(sorted(map(_name, REDUCE_DTYPES)))}; no float64; {SOURCE})")
        if kind == "prod" and tensor.dtype in PROD_REFUSED:
            raise HcclRefused(f"emulated HCCL {op}: prod is refused for dtype {_name(tensor.dtype)} on Atlas A2/A3 "
                              f"(HcclAllReduce: prod not for int16, bfp16; {SOURCE})")


class EmulatedHcclProcessGroup(ProcessGroup):
    """Checks, then delegates to a gloo ProcessGroup on the same store (gloo's Work is returned as is)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        gloo = ProcessGroupGloo(store, rank, size, timeout=timeout)
        # the inner group runs gloo on the CPU tensors; the same backend object registered here for 'npu' carries
        # this group's name (torch keeps a group's name in its backends: the functional collectives and DTensor
        # resolve groups by name) and its device type. An op not defined below reaches torch's ProcessGroup, which
        # finds no backend for a CPU tensor and raises: unimplemented ops are refused, never passed to gloo unchecked.
        self._gloo = ProcessGroup(store, rank, size)
        self._gloo._set_default_backend(ProcessGroup.BackendType.GLOO)
        self._gloo._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
        self._register_backend(torch.device("npu"), ProcessGroup.BackendType.CUSTOM, gloo)

    def getBackendName(self) -> str:
        return BACKEND

    # ---- reductions -------------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        check_reduction("allreduce", tensors, opts.reduceOp)
        return self._gloo.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        check_reduction("allreduce_coalesced", tensors, opts.reduceOp)
        return self._gloo.allreduce_coalesced(tensors, opts)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        check_reduction("reduce", tensors, opts.reduceOp)
        return self._gloo.reduce(tensors, opts)

    def reduce_scatter(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        check_reduction("reduce_scatter", [outputs, inputs], opts.reduceOp)
        return self._gloo.reduce_scatter(outputs, inputs, opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        check_reduction("reduce_scatter_tensor", [output, input], opts.reduceOp)
        return self._gloo._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        check_reduction("reduce_scatter_tensor_coalesced", [outputs, inputs], opts.reduceOp)
        return self._gloo.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    # ---- data movement ----------------------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        check_movement("broadcast", tensors)
        return self._gloo.broadcast(tensors, opts if opts is not None else dist.BroadcastOptions())

    def allgather(self, outputs, inputs, opts=None):
        check_movement("allgather", [outputs, inputs])
        return self._gloo.allgather(outputs, inputs, opts if opts is not None else dist.AllgatherOptions())

    def _allgather_base(self, output, input, opts=None):
        check_movement("all_gather_into_tensor", [output, input])
        return self._gloo._allgather_base(output, input, opts if opts is not None else dist.AllgatherOptions())

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def allgather_coalesced(self, outputs, inputs, opts=None):
        check_movement("allgather_coalesced", [outputs, inputs])
        return self._gloo.allgather_coalesced(outputs, inputs, opts if opts is not None else dist.AllgatherOptions())

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        check_movement("allgather_into_tensor_coalesced", [outputs, inputs])
        return self._gloo.allgather_into_tensor_coalesced(outputs, inputs,
                                                          opts if opts is not None else dist.AllgatherOptions())

    def alltoall(self, outputs, inputs, opts=None):
        check_movement("alltoall", [outputs, inputs])
        return self._gloo.alltoall(outputs, inputs, opts if opts is not None else dist.AllToAllOptions())

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        check_movement("alltoall_base", [output, input])
        return self._gloo.alltoall_base(output, input, output_splits, input_splits,
                                        opts if opts is not None else dist.AllToAllOptions())

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return self.alltoall_base(output, input, output_splits, input_splits, opts)

    def send(self, tensors, dst, tag=0):
        check_movement("send", tensors)
        return self._gloo.send(tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        check_movement("recv", tensors)
        return self._gloo.recv(tensors, src, tag)

    def barrier(self, opts=None):
        return self._gloo.barrier(opts if opts is not None else dist.BarrierOptions())

    def scatter(self, outputs, inputs, opts=None):
        check_movement("scatter", [outputs, inputs])
        return self._gloo.scatter(outputs, inputs, opts if opts is not None else dist.ScatterOptions())

    def gather(self, *args, **kwargs):
        raise HcclRefused(f"emulated HCCL gather: refused, as torch_npu refuses it (ProcessGroupHCCL::gather: "
                          f"'ProcessGroupHCCL does not support gather'; {SOURCE})")

    # ---- not implemented: refused ----------------------------------------------------------------------------

    def recv_anysource(self, *args, **kwargs):
        refuse("distributed hccl recv_anysource", "a receive from any source")

    def monitored_barrier(self, *args, **kwargs):
        refuse("distributed hccl monitored_barrier", "monitored_barrier")

    def split_group(self, *args, **kwargs):
        refuse("distributed hccl split_group", "splitting a group (new_group makes one)")

    def merge_remote_group(self, *args, **kwargs):
        refuse("distributed hccl merge_remote_group", "merging groups")


def _create(backend_opts, pg_options) -> EmulatedHcclProcessGroup:
    if pg_options is not None:
        refuse("distributed hccl", f"process-group options {pg_options!r}")
    return EmulatedHcclProcessGroup(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                                    backend_opts.timeout)


def register() -> None:
    """Once per process, at import of the emulated torch_npu (as the real one registers its backend)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    # 'cpu' besides 'npu': the emulated npu tensors are CPU tensors (module docstring)
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["npu", "cpu"])
