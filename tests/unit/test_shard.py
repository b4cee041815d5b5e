"""--shard I/N: every scenario in exactly one shard, shards even by expected cost, the same split on every
runner, and bad input named."""

from __future__ import annotations

import pytest

from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from parity.harness.config.selection import DEFAULT_FILES
from parity.harness.config.shard import Shard, cost, split

pytestmark = pytest.mark.torch_free


def test_shards_cover_the_matrix_once_and_evenly():
    scenarios = load_file(DEFAULT_FILES[0])
    for count in (2, 3, 4):
        parts = [split(scenarios, Shard(i, count)) for i in range(1, count + 1)]
        ids = [s.id for part in parts for s in part]
        assert sorted(ids) == sorted(s.id for s in scenarios) and len(set(ids)) == len(ids)
        loads = [sum(map(cost, part)) for part in parts]
        assert max(loads) - min(loads) <= max(map(cost, scenarios))  # LPT: within one scenario's cost
    assert [s.id for s in split(scenarios[::-1], Shard(1, 2))] == [s.id for s in split(scenarios, Shard(1, 2))][::-1]


def test_a_bad_shard_is_named():
    assert Shard.parse("2/3") == Shard(2, 3)
    for text in ("0/2", "3/2", "1-2", "a/b"):
        with pytest.raises(ScenarioError, match=r"--shard .*expected I/N"):
            Shard.parse(text)

