"""The first divergent module, over a planted set: a fault at a known module (attention core, RoPE, norms, MLP,
router, lm head; tests/data/planted_modules.py) is named by the FAIL in at least 90 % of cases, and a clean twin
of the same engine names none."""

from __future__ import annotations

import pytest

from parity.harness.contract.schema import Scenario
from tests.data.planted_modules import EXPECTED

pytestmark = pytest.mark.multiprocess


def _where(runner, engine: str, model: str) -> dict:
    scenario = Scenario(model=model, engine=f"tests.data.planted_modules:{engine}", timeout=120)
    verdict = runner.run_scenario(scenario)
    return verdict.status, verdict.metrics.get("first_divergent") or {}


def test_planted_faults_are_named_at_their_module(runner):
    named, misses = 0, []
    for engine, (model, module) in EXPECTED.items():
        status, where = _where(runner, engine, model)
        if status == "FAIL" and where.get("first") == module:
            named += 1
        else:
            misses.append(f"{engine}: {status} {where.get('line')} (expected {module})")
    assert named / len(EXPECTED) >= 0.9, misses


def test_a_clean_twin_names_no_module(runner):
    scenario = Scenario(model="tiny-qwen3-moe", engine="parity.engines.hf.engine:HFEngine", timeout=120)
    verdict = runner.run_scenario(scenario)
    where = verdict.metrics["first_divergent"]
    assert verdict.status == "PASS" and where["first"] is None and where["compared"] == 19, where
