"""Layouts Megatron-Core cannot run, found before any process starts. The generic checks every engine shares
(heads, layers and experts divisible; sequence and batch splits) live in the harness's validation. Imports nothing
heavy (no torch, no megatron) so that the harness validator can call it on a laptop.
"""

from __future__ import annotations

from typing import Any

#: rows per micro-batch unless mcore_kwargs.micro_batch_size says otherwise (the engine's schedule settings)
DEFAULT_MICRO_BATCH_SIZE = 1


def micro_batch_rows(scenario: Any) -> int:
    """Rows per micro-batch the schedule runs (the memory plan's micro-batches in flight)."""
    return int(scenario.mcore_kwargs.get("micro_batch_size", DEFAULT_MICRO_BATCH_SIZE))


def expert_tensor_parallel(layout: Any) -> int:
    """Megatron's expert TP degree for a layout. With ep == 1 the experts are not expert-parallel, so Megatron
    reduces their gradients with the dense parameters (over dp x cp only): that is right only when the experts
    are split like the dense layers (ETP == TP, Megatron's own default). A layout's etp therefore applies with
    ep > 1; with ep == 1 the experts follow tp (the rule below rejects an explicit, different etp)."""
    return layout.etp if layout.ep > 1 else layout.tp


def megatron_layout_errors(scenario: Any, shape: Any) -> list[tuple[str, str]]:
    """(key, message) for each rule the scenario's layout breaks; `shape` is the model's ModelShape."""
    layout = scenario.layout
    errors: list[tuple[str, str]] = []
    moe = shape.num_experts > 0
    if moe and layout.tp > 1 and not layout.sequence_parallel:
        errors.append(("layout.sequence_parallel", f"a MoE model with tp({layout.tp}) needs "
                                                   "sequence_parallel: true"))
    if layout.ep > 1 and not moe:
        errors.append(("layout.ep", f"ep({layout.ep}) needs a mixture-of-experts model"))
    if layout.etp > 1 and not moe:
        errors.append(("layout.etp", f"etp({layout.etp}) needs a mixture-of-experts model"))
    if moe and layout.ep == 1 and layout.etp not in (1, layout.tp):
        # Megatron-Core reduces non-expert-parallel experts with the dense parameters, over dp x cp only:
        # experts replicated across TP ranks would never have their gradients summed
        errors.append(("layout.etp", f"with ep=1 the experts are split like the dense layers: etp({layout.etp}) "
                                     f"must equal tp({layout.tp}) (or be left at 1)"))
    if (moe and (layout.pp > 1 or layout.ep > 1) and scenario.workload.packing == "packed"
            and scenario.mcore_kwargs.get("moe_token_dispatcher_type", "allgather") == "allgather"):
        # ep: the allgather dispatcher gathers equal token counts over the expert group, and packed streams of
        # different data-parallel ranks differ in length; pp: stages exchange shapes (variable_seq_lengths), which
        # Megatron refuses with allgather. verl configures alltoall for every MoE model
        errors.append(("mcore_kwargs.moe_token_dispatcher_type", "packed MoE micro-batches with ep > 1 or pp > 1 "
                                                                  "need moe_token_dispatcher_type: alltoall"))
    microbatches, size_errors = _micro_batches(scenario)
    return errors + size_errors + _pipeline_errors(layout, microbatches)


def _micro_batches(scenario: Any) -> tuple[int | None, list[tuple[str, str]]]:
    """(micro-batches per data-parallel rank, errors): the rows a rank holds must split into whole micro-batches
    of mcore_kwargs.micro_batch_size rows (engines/megatron/batching.py); found here, not in every rank."""
    size = scenario.mcore_kwargs.get("micro_batch_size", DEFAULT_MICRO_BATCH_SIZE)
    rows = scenario.workload.batch_size // max(scenario.layout.dp, 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return None, [("mcore_kwargs.micro_batch_size",
                       f"must be a positive integer (rows per micro-batch), got {size!r}")]
    if rows % size:
        return None, [("mcore_kwargs.micro_batch_size", f"micro_batch_size({size}) must divide the {rows} rows per "
                                                        "data-parallel rank (batch_size / dp)")]
    return rows // size, []


def _pipeline_errors(layout: Any, microbatches: int | None) -> list[tuple[str, str]]:
    """`microbatches`: per data-parallel rank, None where the micro-batch size is already wrong."""
    errors: list[tuple[str, str]] = []
    if layout.vpp > 1 and layout.pp == 1:
        errors.append(("layout.vpp", f"vpp({layout.vpp}) interleaves pipeline stages: it needs pp > 1"))
    if layout.vpp > 1 and microbatches is not None and microbatches % layout.pp:
        errors.append(("layout.vpp", f"the interleaved schedule needs the {microbatches} micro-batches per "
                                     "data-parallel rank (batch_size / dp / micro_batch_size) to be a multiple of "
                                     f"pp({layout.pp})"))
    return errors
