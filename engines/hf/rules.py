"""The `hf` family's scenario rules (torch-free)."""

from __future__ import annotations


def hf_errors(scenario: object, shape: object) -> list[tuple[str, str]]:
    """The reference computes every adv_estimator but GAE, whose advantages come from a critic it does not train."""
    if scenario.workload.adv_estimator == "gae":  # type: ignore[attr-defined]
        return [("workload.adv_estimator", "gae needs a critic (a value model's per-token values, verl "
                                           "compute_gae_advantage_return); the hf reference trains no critic")]
    return []
