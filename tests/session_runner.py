"""The Runner the tests share (the `runner` and `verl_runner` fixtures of tests/conftest.py); apart from the
conftest because it imports torch."""

from __future__ import annotations

import shutil
from typing import Any

from parity.harness.contract.schema import Scenario
from parity.harness.judge.verdict import Verdict
from parity.harness.runner import Runner
from tests.conftest import ITEM_RUNS, _run_key


class SessionRunner(Runner):
    """The Runner the tests share. A scenario identical field for field to one run earlier in the session returns
    that run's verdict (its record stays under out_dir): a clean twin several tests judge runs once. One that a
    scenario item of this session already ran to a verdict (PASS or FAIL: it finished, so its timeout did not
    matter) takes that verdict, and its record is copied under out_dir as if it had run here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: dict[str, Verdict] = {}

    def run_scenario(self, scenario: Scenario) -> Verdict:
        key = scenario.model_dump_json(exclude={"marks", "source"})
        if key not in self._verdicts:
            self._verdicts[key] = self._from_items(scenario) or super().run_scenario(scenario)
        return self._verdicts[key]

    def _from_items(self, scenario: Scenario) -> Verdict | None:
        verdict, records = ITEM_RUNS.get(_run_key(scenario), (None, None))
        if verdict is None or verdict.status not in ("PASS", "FAIL") or not records.is_dir():
            return None
        shutil.copytree(records, self._record_dir(scenario), dirs_exist_ok=True)
        return verdict
