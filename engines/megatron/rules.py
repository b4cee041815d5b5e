"""Layouts Megatron-Core cannot run, found before any process starts. Imports nothing heavy (no torch, no
megatron) so that the harness validator can call it on a laptop.
"""

from __future__ import annotations

from typing import Any


def megatron_layout_errors(scenario: Any, shape: Any) -> list[tuple[str, str]]:
    """(key, message) for each rule the scenario's layout breaks; `shape` is a harness.models.ModelShape."""
    layout, workload = scenario.layout, scenario.workload
    errors: list[tuple[str, str]] = []
    moe = shape.num_experts > 0
    if layout.ulysses > 1:
        errors.append(("layout.ulysses", "Ulysses belongs to the fsdp2 engine; Megatron's sequence split is 'cp'"))
    if shape.num_heads % layout.tp or shape.num_kv_heads % layout.tp:
        errors.append(("layout.tp", f"tp({layout.tp}) must divide the attention heads ({shape.num_heads}) and "
                                    f"the KV heads ({shape.num_kv_heads})"))
    if moe and layout.tp > 1 and not layout.sequence_parallel:
        errors.append(("layout.sequence_parallel", f"a MoE model with tp({layout.tp}) needs "
                                                   "sequence_parallel: true"))
    if layout.ep > 1 and not moe:
        errors.append(("layout.ep", f"ep({layout.ep}) needs a mixture-of-experts model"))
    if moe and shape.num_experts % layout.ep:
        errors.append(("layout.ep", f"ep({layout.ep}) must divide the number of experts ({shape.num_experts})"))
    if layout.etp > 1 and not moe:
        errors.append(("layout.etp", f"etp({layout.etp}) needs a mixture-of-experts model"))
    if moe and layout.ep == 1 and layout.etp not in (1, layout.tp):
        # Megatron-Core reduces non-expert-parallel experts with the dense parameters, over dp x cp only:
        # experts replicated across TP ranks would never have their gradients summed
        errors.append(("layout.etp", f"with ep=1 the experts are split like the dense layers: etp({layout.etp}) "
                                     f"must equal tp({layout.tp}) (or be left at 1)"))
    errors += _pipeline_errors(layout, workload, shape)
    seq = workload.prompt_len + workload.response_len
    if layout.cp > 1 and seq % (2 * layout.cp):
        errors.append(("layout.cp", f"cp({layout.cp}) splits the sequence into 2*cp load-balanced chunks: "
                                    f"seq_len {seq} must be divisible by {2 * layout.cp}"))
    if layout.sequence_parallel and (seq // layout.cp) % layout.tp:
        errors.append(("layout.sequence_parallel", f"sequence parallel splits each rank's {seq // layout.cp} "
                                                   f"tokens over tp({layout.tp}): they must divide evenly"))
    if workload.batch_size % layout.dp:
        errors.append(("workload.batch_size", f"dp({layout.dp}) must divide batch_size({workload.batch_size})"))
    return errors


def _pipeline_errors(layout: Any, workload: Any, shape: Any) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    if layout.vpp > 1 and layout.pp == 1:
        errors.append(("layout.vpp", f"vpp({layout.vpp}) interleaves pipeline stages: it needs pp > 1"))
    stages = layout.pp * layout.vpp
    if shape.num_layers % stages:
        errors.append(("layout.vpp" if layout.vpp > 1 else "layout.pp",
                       f"pp({layout.pp}) * vpp({layout.vpp}) = {stages} must divide num_layers "
                       f"({shape.num_layers})"))
    microbatches = workload.batch_size // max(layout.dp, 1)
    if layout.vpp > 1 and microbatches % layout.pp:
        errors.append(("layout.vpp", f"the interleaved schedule needs the {microbatches} micro-batches per "
                                     f"data-parallel rank (batch_size / dp) to be a multiple of pp({layout.pp})"))
    return errors
