"""The first divergent module: walk the first forward's per-module fingerprints (harness/contract/fingerprint.py)
of candidate and reference in forward order and name the first module whose output leaves its limit, and the last
one inside it. A diagnosis for the report, never a check: it turns no row red by itself."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from parity.harness.contract.fingerprint import order_key, summary

REL_LIMIT = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
"""How far a module's per-token mean or RMS may move against the fp32 reference's (÷ the reference's RMS) and still
be inside: an fp32 forward that sums in another order moves them by ~1e-6 (harness/judge/tolerances.py holds
the output-level limits); a 16-bit forward by its rounding (`benchmarks/fingerprint_cost.py` prints both)."""


@dataclass(frozen=True, slots=True)
class Divergence:
    first: str | None
    """The first module in forward order whose output leaves the limit (None: every compared one is inside)."""
    last_inside: str | None
    """The module before it that was still inside (None: the very first module diverged)."""
    rel: float | None
    """The first divergent module's worst relative move (mean or RMS, ÷ the reference's RMS)."""
    limit: float
    compared: int
    not_compared: list[str] = field(default_factory=list)
    """Modules one side did not fingerprint (a layout whose outputs do not line up with the batch)."""
    note: str = ""

    def line(self) -> str:
        """One line for the reports."""
        if self.note:
            return f"first forward by module: {self.note}"
        gaps = f"; {len(self.not_compared)} module(s) not compared" if self.not_compared else ""
        if self.first is None:
            return (f"first forward by module: all {self.compared} inside {self.limit:.0e} (the divergence starts "
                    f"after the first forward: backward or update){gaps}")
        after = f", last inside: {self.last_inside}" if self.last_inside else ", the first module compared"
        return (f"first divergent module: {self.first} (forward, step 1; rel {self.rel:.3g} > {self.limit:.0e})"
                f"{after}{gaps}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"line": self.line()}


def module_rel(candidate: dict[str, float], reference: dict[str, float]) -> float:
    c, r = summary(candidate), summary(reference)
    scale = r["rms"] if r["rms"] > 0 else 1.0
    return max(abs(c["rms"] - r["rms"]), abs(c["mean"] - r["mean"])) / scale


def first_divergent(candidate: dict[str, Any] | None, reference: dict[str, Any] | None,
                    dtype: str) -> Divergence | None:
    """None when neither side fingerprinted its forward; otherwise where the candidate first leaves it."""
    limit = REL_LIMIT.get(dtype, REL_LIMIT["bf16"])
    if not candidate or not reference:
        if not candidate and not reference:
            return None
        missing = "the candidate" if not candidate else "the reference"
        return Divergence(None, None, None, limit, 0, note=f"not fingerprinted by {missing}")
    cand, ref = candidate.get("modules") or {}, reference.get("modules") or {}
    names = sorted(set(cand) | set(ref), key=order_key)
    not_compared = [n for n in names if n not in cand or n not in ref]
    last, compared = None, 0
    for name in names:
        if name in not_compared:
            continue
        if cand[name]["tokens"] != ref[name]["tokens"]:
            return Divergence(name, last, math.inf, limit, compared, not_compared,
                              note=f"{name} saw {cand[name]['tokens']:g} real tokens, the reference "
                                   f"{ref[name]['tokens']:g} (the batch did not reach it whole)")
        compared += 1
        rel = module_rel(cand[name], ref[name])
        if not rel <= limit:  # NaN leaves too
            return Divergence(name, last, rel, limit, compared, not_compared)
        last = name
    return Divergence(None, last, None, limit, compared, not_compared)
