"""Per-token |Δ log-prob| as a histogram on log-spaced bins, so a report can draw the error distribution
without the tensors (errors span orders of magnitude: 1e-7 in fp32, 1e-2 in bf16, 1 for a real bug)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the bins are torch-free: the report pages and their tests read them without torch
    import torch

LOG10_LOW, LOG10_HIGH, BINS_PER_DECADE = -10, 2, 4
PHASES = ("logprobs_before", "logprobs_after")


def edges() -> list[float]:
    count = (LOG10_HIGH - LOG10_LOW) * BINS_PER_DECADE
    return [10 ** (LOG10_LOW + i / BINS_PER_DECADE) for i in range(count + 1)]


def abs_diff_histogram(candidate: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """Counts of real tokens per bin; |Δ| below the first edge (exact matches too) in `below`, above the last
    edge or non-finite in `above`."""
    import torch

    diff = (candidate.double() - reference.double()).abs()[mask.bool()]
    bounds = torch.tensor(edges(), dtype=torch.float64)
    finite = diff[torch.isfinite(diff)]
    inside = finite[(finite >= bounds[0]) & (finite <= bounds[-1])]
    counts = torch.histogram(inside, bins=bounds).hist if inside.numel() else torch.zeros(len(bounds) - 1)
    return {"counts": [int(c) for c in counts], "below": int((finite < bounds[0]).sum()),
            "above": int(diff.numel() - finite.numel() + (finite > bounds[-1]).sum())}


def histograms(candidate: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    mask = reference["response_mask"]
    return {"edges": edges(), **{phase: abs_diff_histogram(candidate[phase], reference[phase], mask)
                                 for phase in PHASES}}
