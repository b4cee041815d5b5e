"""MoE load statistics of a Megatron run: tokens per expert per layer, as Megatron's router counts them for load
balancing — `routing_map & ~padding_mask`, the statistic its expert-bias update accumulates
(`TopKRouter._apply_expert_bias`) and its aux losses reduce (`compute_routing_scores_for_aux_loss`,
megatron/core/transformer/moe/router.py, moe_utils.py; `padding_mask` True = padding, since megatron-core 0.15).

Read from the router itself: `routing()` is wrapped per instance and its (routing_map, padding_mask) counted
during training forwards, so what is reported is what Megatron's statistics saw — padding the engine did not mark
(or a release without `padding_mask`) is counted, as it is in Megatron's aux loss.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist


def accepts_padding_mask() -> bool:
    """Whether this release's GPTModel.forward takes `padding_mask` for MoE routing (0.15+)."""
    from megatron.core.models.gpt import GPTModel

    return "padding_mask" in inspect.signature(GPTModel.forward).parameters


class RouterLoads:
    """Counts per global layer; `collect()` sums them over the world (each rank's routers see distinct tokens:
    MoE with tp > 1 runs sequence parallel; dp, cp, ep and pp ranks hold different tokens or layers)."""

    def __init__(self, chunks: list[Any], num_layers: int, num_experts: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        # fp32: exact for any count a step has, and a dtype every collective backend reduces (HCCL has no float64;
        # under MindSpeed a float64 all-reduce came back unreduced)
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.float32)
        self.active = False
        self.layers: set[int] = set()
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    self._wrap(module)

    def _wrap(self, router: Any) -> None:
        original = router.routing

        def routing(logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            probs, routing_map = original(logits, *args, **kwargs)
            if self.active and torch.is_grad_enabled():
                padding = kwargs.get("padding_mask", args[0] if args else None)
                counted = routing_map.bool()
                if padding is not None:
                    counted = counted & ~padding.reshape(-1, 1).bool()
                self.counts[router.layer_number - 1] += counted.sum(dim=0).float().cpu()
            return probs, routing_map

        router.routing = routing
        self.layers.add(router.layer_number - 1)

    def collect(self, device: torch.device) -> dict[str, list[float]]:
        """Every rank: the step's loads summed over the world, then reset; MoE layers only."""
        total = self.counts.clone().to(device)  # a copy: the reset below must not clear it
        dist.all_reduce(total)
        held = torch.tensor([1.0 if i in self.layers else 0.0 for i in range(len(total))], device=device)
        dist.all_reduce(held)
        self.counts.zero_()
        return {f"layers.{i}.mlp": total[i].tolist() for i in range(len(total)) if held[i] > 0}
