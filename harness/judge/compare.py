"""Pure comparison functions: tensors and per-step series in, difference summaries out. No I/O, no verdicts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TokenDiff:
    """Differences over the real (unpadded) response tokens."""

    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    kl_k3: float
    """Mean k3 estimate of KL(candidate || reference): exp(r) - r - 1 with r = ref - cand (Schulman)."""
    tokens: int


def token_diff(candidate: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> TokenDiff:
    if candidate.shape != reference.shape:
        raise ValueError(f"shape mismatch: candidate {tuple(candidate.shape)} vs reference {tuple(reference.shape)}")
    keep = mask.bool()
    cand, ref = candidate.double()[keep], reference.double()[keep]
    if cand.numel() == 0:
        raise ValueError("no real response tokens to compare")
    diff = (cand - ref).abs()
    log_ratio = ref - cand
    k3 = torch.exp(log_ratio) - log_ratio - 1
    return TokenDiff(max_abs=float(diff.max()), mean_abs=float(diff.mean()), median_abs=float(diff.median()),
                     p99_abs=float(torch.quantile(diff, 0.99)), kl_k3=float(k3.mean()), tokens=int(cand.numel()))


def rel_diff(candidate: float, reference: float, floor: float = 1e-12) -> float:
    """|c - r| / max(|r|, floor); NaN in either gives NaN, inf gives inf (neither ever passes a `<=` check)."""
    if math.isnan(candidate) or math.isnan(reference):
        return math.nan
    if math.isinf(candidate) or math.isinf(reference):
        return math.inf
    return abs(candidate - reference) / max(abs(reference), floor)


def rel_limit(rtol: float, atol: float, reference: float) -> float:
    """`|c - r| <= atol + rtol * |r|` expressed on the relative difference |c - r| / |r|: rtol + atol / |r|.
    The absolute term keeps a reference loss near zero (a GRPO step-1 loss of ~1e-5) from turning rounding into
    a large relative error."""
    if not math.isfinite(reference):
        return rtol
    return rtol + atol / max(abs(reference), 1e-12)


@dataclass(frozen=True, slots=True)
class SeriesDiff:
    """Relative difference at EVERY step (never a subset); a missing step is inf."""

    per_step: tuple[float, ...]

    @property
    def worst(self) -> float:
        """NaN counts as the worst value."""
        return max(self.per_step, key=_nan_last, default=0.0)

    @property
    def worst_step(self) -> int:
        return 1 + max(range(len(self.per_step)), key=lambda i: _nan_last(self.per_step[i])) if self.per_step else 0


def _nan_last(value: float) -> float:
    return math.inf if math.isnan(value) else value


def series_rel_diff(candidate: Sequence[float], reference: Sequence[float]) -> SeriesDiff:
    steps = max(len(candidate), len(reference))
    values = []
    for i in range(steps):
        if i >= len(candidate) or i >= len(reference):
            values.append(math.inf)
        else:
            values.append(rel_diff(candidate[i], reference[i]))
    return SeriesDiff(tuple(values))


def error_ratio(candidate_error: float, baseline_error: float, floor: float) -> float:
    """Three-way lane (msprobe style): how many times further from fp32 the candidate is than the baseline.
    `floor` keeps a near-perfect baseline from turning noise into a huge ratio."""
    if not math.isfinite(candidate_error):
        return candidate_error
    if not math.isfinite(baseline_error):  # an infinite baseline error would make any candidate look perfect
        return math.nan
    return candidate_error / max(baseline_error, floor)
