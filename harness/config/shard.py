"""`--shard I/N`: split the selected scenarios over N jobs deterministically and evenly by expected cost, so N
runners finish together and `parity report` merges their out dirs into the full matrix."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from parity.harness.config.errors import ScenarioError
from parity.harness.contract.schema import Scenario


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    """1-based."""
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
        if not match or not 1 <= int(match[1]) <= int(match[2]):
            raise ScenarioError(f"--shard {text!r}: expected I/N with 1 <= I <= N (e.g. 1/4)")
        return cls(int(match[1]), int(match[2]))


def cost(scenario: Scenario) -> int:
    """Expected cost: ranks x training steps (a run's time grows with both; setup is a constant per rank)."""
    return scenario.layout.world_size * (scenario.workload.steps + 1)


def split(scenarios: Sequence[Scenario], shard: Shard) -> list[Scenario]:
    """This shard's scenarios, in their original order. Longest-processing-time first: the costliest scenario
    goes to the least-loaded shard (ties: lowest shard, then id), so every shard computes the same assignment."""
    loads = [0] * shard.count
    owner: dict[str, int] = {}
    for scenario in sorted(scenarios, key=lambda s: (-cost(s), s.id)):
        target = min(range(shard.count), key=lambda i: (loads[i], i))
        loads[target] += cost(scenario)
        owner[scenario.id] = target
    return [s for s in scenarios if owner[s.id] == shard.index - 1]
