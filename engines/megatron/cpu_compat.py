"""Megatron-Core on CPU with gloo: every patch in one place, applied only when the device is cpu.

Megatron-Core assumes CUDA in a handful of places (see docs/megatron.md for the list and why each patch is
sound). This shim patches private functions that have the same signatures in every release of the supported
range (MEGATRON_CORE in engines/megatron/spec.py), probing for what differs between them; it refuses a release outside
that range rather than patch something it has not read. `CpuCompat.apply()` records every attribute it
replaces and `restore()` puts them back, so a forked rank that runs another engine afterwards sees stock torch
and Megatron. On cuda / npu nothing here runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo
import torch.autograd.graph
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from parity.engines.megatron.compat import require_supported_version


def config_overrides() -> dict[str, object]:
    """TransformerConfig settings a CPU run needs.

    batch_p2p_comm=False: batched isend/irecv on one gloo group matches messages between two ranks by posting
    order, so with pp=2 (previous and next stage are the same rank) the interleaved schedule's combined
    forward+backward exchange delivers a gradient where an activation was expected. The unbatched path puts
    the two directions on different groups, as Megatron already does for pp=2."""
    return {"batch_p2p_comm": False}


# ---- stand-ins for CUDA objects ------------------------------------------------------------------------
class _NullEvent:
    """torch.cuda.Event on a device that executes synchronously."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any) -> None:
        pass

    def query(self) -> bool:
        return True


class _NullStream:
    """torch.cuda.Stream: CPU work is already ordered, so waiting and recording are no-ops."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any) -> _NullEvent:
        return _NullEvent()

    def synchronize(self) -> None:
        pass


_DEFAULT_STREAM = _NullStream()


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpuMode(TorchFunctionMode):
    """Maps tensors Megatron creates or moves on 'cuda' (schedules' `torch.zeros([], device="cuda")`, `.cuda()`,
    `pin_memory()`) to the CPU, and answers `tensor.type()` with the CUDA type name: the optimizers and grad
    clipping dispatch on `param.type() == 'torch.cuda.FloatTensor'` (else they raise TypeError / assert)."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("cuda", "pin_memory") and args and isinstance(args[0], torch.Tensor):
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        if name == "to" and any(_is_cuda(a) for a in args[1:]):
            args = tuple("cpu" if i and _is_cuda(a) else a for i, a in enumerate(args))
        out = func(*args, **kwargs)
        if name == "type" and len(args) == 1 and not kwargs and isinstance(out, str) and ".cuda." not in out:
            return out.replace("torch.", "torch.cuda.", 1)
        return out


# ---- replacements for Megatron functions ---------------------------------------------------------------
def _cpu_rng_get(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_rng_set(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(state)


def _move_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """moe_utils.maybe_move_tensor_to_cpu: split sizes must become host values even when already on CPU
    (all_to_all_single rejects tensors as split sizes)."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.cpu().numpy()
    return tensor


def _gather_first_dim_gloo(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """mappings._gather_along_first_dim: gloo cannot all_gather unequal sizes; pad to the largest, gather, trim."""

    def gather(input_: torch.Tensor, group: Any = None, output_split_sizes: Any = None,
               use_global_buffer: bool = False) -> torch.Tensor:
        if output_split_sizes is None or group is None or group.size() == 1:
            return original(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(s) for s in output_split_sizes]
        padded = input_.new_zeros(max(sizes), *input_.shape[1:])
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    return gather


def _reduce_scatter_first_dim_gloo(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """mappings._reduce_scatter_along_first_dim with unequal splits (the backward of the gather above):
    all-reduce the whole tensor and keep this rank's rows."""

    def reduce_scatter(input_: torch.Tensor, group: Any = None, input_split_sizes: Any = None,
                       use_global_buffer: bool = False) -> torch.Tensor:
        if input_split_sizes is None or group is None or group.size() == 1:
            return original(input_, group, input_split_sizes, use_global_buffer)
        total = input_.contiguous().clone()
        dist.all_reduce(total, group=group)
        return list(torch.split(total, [int(s) for s in input_split_sizes]))[group.rank()].contiguous()

    return reduce_scatter


def _quantize_nothing_early(original: Callable[..., None]) -> Callable[..., None]:
    """fp8_utils._quantize_param_shard_impl without Transformer Engine: the distributed optimizer calls it on every
    step, with an empty list when there are no fp8 params. Up to 0.12 it raises even then; return early as 0.13+
    do (a non-empty list still reaches the original, which raises)."""

    def quantize(model_params: Any, *args: Any, **kwargs: Any) -> None:
        if len(model_params) == 0:
            return
        original(model_params, *args, **kwargs)

    return quantize


#: message tags of the shape exchange, one per direction
_FORWARD, _BACKWARD = 1, 2


def _exchange_shapes(send_next: torch.Tensor | None, send_prev: torch.Tensor | None, recv_prev: bool,
                     recv_next: bool, group: Any, prev_rank: int, next_rank: int) -> tuple[list[int], list[int]]:
    """p2p_communication `_communicate_shapes` (pipeline stages exchange the shapes of micro-batches of their own
    lengths, `variable_seq_lengths`), with each message tagged by its direction. Megatron batches the four
    isend/irecv on one group, and gloo matches two messages between the same two ranks by posting order: with pp = 2
    (previous and next stage are one rank) the interleaved schedule's combined exchange received the backward
    shape as the forward one (gloo: 'Received data size doesn't match expected size'). Same answer otherwise."""
    received = {"prev": torch.zeros(3, dtype=torch.int64), "next": torch.zeros(3, dtype=torch.int64)}
    requests = []
    if send_prev is not None:
        requests.append(dist.isend(torch.tensor(send_prev.size(), dtype=torch.int64), prev_rank, group=group,
                                   tag=_BACKWARD))
    if recv_prev:
        requests.append(dist.irecv(received["prev"], prev_rank, group=group, tag=_FORWARD))
    if send_next is not None:
        requests.append(dist.isend(torch.tensor(send_next.size(), dtype=torch.int64), next_rank, group=group,
                                   tag=_FORWARD))
    if recv_next:
        requests.append(dist.irecv(received["next"], next_rank, group=group, tag=_BACKWARD))
    for request in requests:
        request.wait()
    return received["prev"].tolist(), received["next"].tolist()


def _shapes_method(self: Any, send_next: Any, send_prev: Any, recv_prev: bool, recv_next: bool) -> Any:
    """P2PCommunicator._communicate_shapes (0.15+)."""
    return _exchange_shapes(send_next, send_prev, recv_prev, recv_next, self.pp_group, self.prev_rank,
                            self.next_rank)


def _shapes_function(send_next: Any, send_prev: Any, recv_prev: bool, recv_next: bool, config: Any) -> Any:
    """p2p_communication._communicate_shapes (up to 0.14: a module function over the global pipeline group)."""
    from megatron.core import parallel_state as ps

    return _exchange_shapes(send_next, send_prev, recv_prev, recv_next, ps.get_pipeline_model_parallel_group(),
                            ps.get_pipeline_model_parallel_prev_rank(), ps.get_pipeline_model_parallel_next_rank())


def _torch_norm_new(cls: type, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> torch.nn.Module:
    """WrappedTorchNorm without its `not sequence_parallel` assert. Under sequence parallel each TP rank normalises
    its own tokens, so the weight gradient is partial: mark it `sequence_parallel` as Megatron's fused norms do,
    and finalize_model_grads sums it over the TP group."""
    norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
    if config.normalization not in norms:
        raise ValueError(f"normalization {config.normalization!r} is not supported by the CPU shim")
    norm = norms[config.normalization](normalized_shape=hidden_size, eps=eps)
    for param in norm.parameters():
        param.sequence_parallel = bool(config.sequence_parallel)
    return norm


def _under_mode(run_backward: Callable[..., Any], mode: TorchFunctionMode) -> Callable[..., Any]:
    def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        if mode in torch.overrides._get_current_function_mode_stack():
            return run_backward(*args, **kwargs)
        with mode:
            return run_backward(*args, **kwargs)

    return engine_run_backward


class CpuCompat:
    """The patch set. `apply()` once per engine setup, `restore()` in teardown."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any, bool]] = []
        self._mode: CudaToCpuMode | None = None

    def _set(self, owner: Any, name: str, value: Any) -> None:
        if isinstance(owner, type):  # keep the raw class attribute (a staticmethod for __new__)
            had = name in vars(owner)
            old = vars(owner).get(name)
        else:
            had = hasattr(owner, name)
            old = getattr(owner, name, None)
        self._saved.append((owner, name, old, had))
        setattr(owner, name, value)

    def apply(self) -> None:
        require_supported_version()
        from megatron.core import fp8_utils
        from megatron.core.pipeline_parallel import p2p_communication
        from megatron.core.tensor_parallel import mappings, random
        from megatron.core.transformer import torch_norm
        from megatron.core.transformer.moe import moe_utils, token_dispatcher

        cuda = torch.cuda
        self._set(cuda, "current_device", lambda: torch.device("cpu"))
        self._set(cuda, "synchronize", lambda *a, **k: None)
        self._set(cuda, "Stream", _NullStream)
        self._set(cuda, "Event", _NullEvent)
        self._set(cuda, "stream", lambda *a, **k: contextlib.nullcontext())
        self._set(cuda, "current_stream", lambda *a, **k: _DEFAULT_STREAM)
        self._set(cuda, "default_stream", lambda *a, **k: _DEFAULT_STREAM)
        # RNG tracker: Megatron's CUDA generator states become CPU generator states
        self._set(cuda, "get_rng_state", _cpu_rng_get)
        self._set(cuda, "set_rng_state", _cpu_rng_set)
        self._set(cuda, "manual_seed", torch.manual_seed)
        self._set(random, "_get_cuda_rng_state", _cpu_rng_get)
        self._set(random, "_set_cuda_rng_state", _cpu_rng_set)
        # MoE: the router's TE gemm import failed silently (NameError later); alltoall split sizes to host
        if getattr(moe_utils, "te_general_gemm", None) is None:
            self._set(moe_utils, "te_general_gemm", None)
        self._set(token_dispatcher, "maybe_move_tensor_to_cpu", _move_to_cpu)
        # the alltoall dispatcher caches its DtoH stream on the class (an instance attribute up to 0.13): drop our
        # stand-in on restore
        if "cuda_dtoh_stream" in vars(token_dispatcher.MoEAlltoAllTokenDispatcher):
            self._set(token_dispatcher.MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None)
        self._set(fp8_utils, "_quantize_param_shard_impl",
                  _quantize_nothing_early(fp8_utils._quantize_param_shard_impl))
        self._set(mappings, "_gather_along_first_dim", _gather_first_dim_gloo(mappings._gather_along_first_dim))
        self._set(mappings, "_reduce_scatter_along_first_dim",
                  _reduce_scatter_first_dim_gloo(mappings._reduce_scatter_along_first_dim))
        self._set(torch_norm.WrappedTorchNorm, "__new__", _torch_norm_new)
        communicator = getattr(p2p_communication, "P2PCommunicator", None)
        if communicator is not None and "_communicate_shapes" in vars(communicator):
            self._set(communicator, "_communicate_shapes", _shapes_method)
        elif hasattr(p2p_communication, "_communicate_shapes"):
            self._set(p2p_communication, "_communicate_shapes", _shapes_function)
        # torch.compile'd functions run eagerly: Megatron decorates fusions with `jit_fuser`, which is torch.compile
        # on torch >= 2.2 (megatron/core/jit.py), so every forked rank traced and compiled them from a cold cache
        # (dynamo, then inductor's C++). What the CPU matrix reaches is TopKRouter._apply_expert_bias, a no-op
        # without expert bias, whose compiling cost each MoE row dearly; eager is bit-identical on all 16 rows
        self._set(torch._dynamo.config, "disable", True)
        self._mode = CudaToCpuMode()
        # the autograd engine runs a graph's Python backward code (custom autograd Functions) without the mode: the
        # mode's own handler pops it while `loss.backward()` runs, and a Function's backward never sees it anyway.
        # Megatron's activation recompute (tensor_parallel.random.CheckpointFunction) re-runs the forward there,
        # and transformer/utils.py get_default_causal_mask allocates on "cuda". The one call that runs the engine
        # for `Tensor.backward`, `torch.autograd.backward` and `.grad` runs with the mode pushed again
        backward = _under_mode(torch.autograd.graph._engine_run_backward, self._mode)
        self._set(torch.autograd.graph, "_engine_run_backward", backward)
        self._set(torch.autograd, "_engine_run_backward", backward)
        self._mode.__enter__()

    def restore(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for owner, name, value, had in reversed(self._saved):
            if had:
                setattr(owner, name, value)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
        self._saved.clear()


@contextlib.contextmanager
def cpu_compat() -> Iterator[CpuCompat]:
    """The shim for a block (tests); engines call apply()/restore() across setup and teardown."""
    shim = CpuCompat()
    shim.apply()
    try:
        yield shim
    finally:
        shim.restore()
