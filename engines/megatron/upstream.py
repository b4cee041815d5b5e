"""Upstream defects of the installed megatron-core that a row would hit (the Megatron engine's `upstream_defects`),
read from the package's source without importing it: such a row is broken on this stack, naming the file, and
tests/multiproc/test_megatron_engine.py lifts the mark to check it still FAILs there."""

from __future__ import annotations

from typing import Any

from parity.engines.megatron.dist_ckpt_env import _source
from parity.harness.contract.schema import Scenario


def routes_alignment_padding(scenario: Scenario, shape: Any) -> str | None:
    """A packed MoE row whose stream carries alignment tokens (each sequence padded to a multiple of tp, or 2·tp·cp
    with cp > 1) and judges expert loads, on a megatron-core whose GPTModel.forward takes no `padding_mask`
    (before 0.15): Megatron's routers route the alignment tokens and count them in the load statistics its aux loss
    and expert-bias update balance; the engine cannot tell them apart (engines/megatron/moe_load.py)."""
    layout = scenario.layout
    if (scenario.workload.packing != "packed" or shape is None or not shape.num_experts
            or (layout.tp == 1 and layout.cp == 1) or scenario.tolerance.expert_load_abs is None):
        return None
    gpt_model = _source("megatron", "core/models/gpt/gpt_model.py")
    if gpt_model is None or "padding_mask" in gpt_model:
        return None
    return ("megatron-core's GPTModel.forward takes no padding_mask (megatron/core/models/gpt/gpt_model.py; 0.15 "
            "adds it), so its MoE routers route the packed stream's alignment tokens and count them in the load "
            "statistics its aux loss and expert-bias update balance (megatron/core/transformer/moe/router.py "
            "TopKRouter.routing): expert loads exceed the reference's by the alignment tokens")
