"""fsdp2's layout rules (EngineSpec.rules), torch-free."""

from __future__ import annotations


def layout_errors(scenario: object, shape: object) -> list[tuple[str, str]]:
    """fsdp2 splits the inner mesh dimension one way: the sequence (Ulysses) or the heads (TP), not both."""
    layout = scenario.layout  # type: ignore[attr-defined]
    if layout.tp > 1 and layout.ulysses > 1:
        return [("layout.tp", f"fsdp2 takes ulysses({layout.ulysses}) or tp({layout.tp}), not both")]
    return []
