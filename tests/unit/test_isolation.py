"""One scenario's broken output, golden or report ERRORs that scenario; the run goes on."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from parity.harness.contract.engine import StepOutput, TokenOutputs
from parity.harness.contract.schema import Scenario
from parity.harness.options import RunOptions
from parity.harness.run.worker import EngineOutputError, checked_step, checked_tokens
from parity.harness.session import Session


def test_step_output_scalars_become_plain_floats():
    """0-dim tensors (a common engine habit) used to reach record.json as the string 'tensor(6.2)'."""
    loss, norm = checked_step(StepOutput(loss=torch.tensor(6.25), grad_norm=np.float32(1.5)), 1)
    assert (loss, norm) == (6.25, 1.5) and type(loss) is float and type(norm) is float
    loss, norm = checked_step(StepOutput(loss=torch.tensor([math.nan]), grad_norm=2), 1)
    assert math.isnan(loss) and norm == 2.0


@pytest.mark.parametrize(("out", "message"), [
    (StepOutput(loss=torch.ones(2), grad_norm=1.0), "Engine.train_step (step 3): StepOutput.loss is Tensor"),
    (StepOutput(loss=1.0, grad_norm="1.0"), "Engine.train_step (step 3): StepOutput.grad_norm is str"),
    ((1.0, 2.0), "Engine.train_step (step 3) returned tuple on rank 0, expected StepOutput"),
])
def test_step_output_of_the_wrong_type_names_the_method(out, message):
    with pytest.raises(EngineOutputError) as info:
        checked_step(out, 3)
    assert str(info.value).startswith(message)


def test_token_outputs_are_checked_for_type_and_shape_but_nan_values_pass():
    good = TokenOutputs(logprobs=torch.full((2, 3), math.nan, dtype=torch.bfloat16), entropy=torch.zeros(2, 3))
    out = checked_tokens(good, 0, (2, 3), "forward (before training)")
    assert out.logprobs.dtype == torch.float32 and out.logprobs.isnan().all()
    assert checked_tokens(None, 1, (2, 3), "forward") is None  # other ranks may return None
    with pytest.raises(EngineOutputError, match=r"Engine.forward \(after training\): entropy has shape \[3, 2\], "
                                                r"expected \[B, R\] = \[2, 3\]"):
        checked_tokens(TokenOutputs(torch.zeros(2, 3), torch.zeros(3, 2)), 0, (2, 3), "forward (after training)")
    with pytest.raises(EngineOutputError, match=r"logprobs is torch\.int64, expected a floating-point tensor"):
        checked_tokens(TokenOutputs(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3)), 0, (2, 3), "forward")
    with pytest.raises(EngineOutputError, match="returned NoneType on rank 0, expected TokenOutputs"):
        checked_tokens(None, 0, (2, 3), "forward")


def test_unreadable_golden_and_failing_report_error_one_scenario_each(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "record.json").write_text("{not json")
    first = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, reference=f"golden:{broken}")
    second = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, reference=f"golden:{tmp_path}/gone",
                      name="second")
    reported = []

    def on_result(verdict):
        if not reported:
            reported.append(None)
            raise OSError("disk full")
        reported.append(verdict)

    session = Session(RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache"), [first, second],
                      on_result=on_result, figures=False)
    assert session.run_all([first, second]) is None
    verdicts = session.results
    # a golden not recorded yet SKIPs its row naming the command that records it (docs/ascend.md); one that is
    # there but unreadable is an ERROR of its own row
    assert [v["verdict"] for v in verdicts] == ["ERROR", "SKIP"]
    assert verdicts[0]["reasons"] == ["error while reporting: OSError: disk full"]
    assert f"{tmp_path}/gone" in verdicts[1]["reasons"][0] and "parity golden record" in verdicts[1]["reasons"][0]
    # the scenario whose report failed was reported again, as an ERROR, and written as one
    assert [v.id for v in reported[1:]] == [first.id, second.id]
    assert [json.loads(line)["verdict"] for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()] \
        == ["ERROR", "SKIP"]
    assert session.runner.run_scenario(first).reasons[0].startswith(
        f"reference run error: cannot read golden {broken}")
