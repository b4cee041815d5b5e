"""An engine's output types are checked in the worker: scalars as 0-dim tensors are fine, a wrong shape ERRORs
that scenario (naming the method) and the next scenario still runs."""

from __future__ import annotations

from parity.harness.contract.schema import Scenario


def scenario(engine: str) -> Scenario:
    return Scenario(model="tiny-qwen3", engine=f"tests.data.odd_output_engine:{engine}", device="cpu", timeout=120)


def test_tensor_scalars_pass_and_a_wrong_shape_errors_without_stopping_the_run(runner):
    flat, tensors = (runner.run_scenario(scenario(name)) for name in ("FlatLogprobEngine", "TensorStepEngine"))
    assert flat.status == "ERROR"
    assert "Engine.forward (before training): logprobs has shape [64], expected [B, R] = [4, 16]" in flat.reasons[0]
    assert tensors.status == "PASS", tensors.reasons
    assert tensors.metrics["loss_rel_max"] == 0.0
