"""Every engine kwarg a scenario passes must come back in the run record as applied, with its effective value
read back from the engine's objects; a key accepted but not applied FAILs the scenario."""

from __future__ import annotations

from parity.harness.config.matrix import load_file

FILE = """
defaults: {model: tiny-qwen3, layout: {dp: 2}}
matrix:
  - {strategy: fsdp2, fsdp_kwargs: {reshard_after_forward: false, reduce_dtype: fp32}}
  - {engine: "tests.data.leaky_engine:LeakyFSDP2Engine", fsdp_kwargs: {reshard_after_forward: false}}
  - {strategy: fsdp2, fsdp_kwargs: {reshard_after_foward: false}, name: typo}
"""


def test_fsdp2_applies_real_kwargs_and_leaky_or_unknown_ones_fail(runner, write_yaml):
    honest, leaky, typo = (runner.run_scenario(s) for s in load_file(write_yaml(FILE)))
    assert honest.status == "PASS", honest.reasons
    assert honest.metrics["applied_kwargs"] == {"fsdp_kwargs": {"reshard_after_forward": False,
                                                                "reduce_dtype": "fp32"}}
    assert leaky.status == "FAIL"
    assert leaky.reasons == ["engine kwargs not applied as given: fsdp_kwargs.reshard_after_forward "
                             "requested False, effective True"]
    assert typo.status == "FAIL"
    assert typo.reasons == ["dropped engine kwargs: fsdp_kwargs.reshard_after_foward (accepted but never applied "
                            "by the engine)"]
