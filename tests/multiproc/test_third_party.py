"""The documented third-party engine (docs/engines.md) runs by import path and passes; copies of it with a
bug in them fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.harness.config.matrix import load_file

EXAMPLE = Path(__file__).resolve().parents[2] / "parity_examples" / "plain_engine.py"

BUGS = {
    # forgetting the padding mask: log-probs differ at once
    "no_attention_mask": ("attention_mask=batch.attention_mask,", "attention_mask=None,",
                          "log-prob before training max |Δ|"),
    # normalising by the padded length instead of the real response tokens
    "padded_token_count": ("tokens = float(batch.response_mask.sum())", "tokens = float(batch.response_mask.numel())",
                           "loss rel diff at step 1"),
    # reporting the norm AFTER clipping
    "post_clip_norm": ("        self.optimizer.step()\n        return StepOutput(",
                       "        self.optimizer.step()\n        grad_norm = torch.nn.utils.get_total_norm("
                       "[p.grad for p in self.model.parameters()])\n        return StepOutput(",
                       "pre-clip grad norm rel diff at step 1"),
}


def scenario_yaml(engine: str) -> str:
    return f'matrix:\n  - {{model: tiny-qwen3, engine: "{engine}", engine_kwargs: {{loss_scale: 1.0}}}}\n'


def test_example_engine_passes_by_import_path(runner, write_yaml):
    scenario = load_file(write_yaml(scenario_yaml("parity.examples.plain_engine:PlainHFEngine")))[0]
    verdict = runner.run_scenario(scenario)
    assert verdict.status == "PASS", verdict.reasons
    assert verdict.metrics["applied_kwargs"] == {"engine_kwargs": {"loss_scale": 1.0}}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_copy_with_a_bug_fails(bug, runner, write_yaml, tmp_path, monkeypatch):
    before, after, metric = BUGS[bug]
    source = EXAMPLE.read_text()
    assert before in source
    package = tmp_path / f"buggy_{bug}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text(source.replace(before, after))
    monkeypatch.syspath_prepend(str(tmp_path))  # ranks inherit sys.path, as an installed package would be
    scenario = load_file(write_yaml(scenario_yaml(f"buggy_{bug}.engine:PlainHFEngine")))[0]
    verdict = runner.run_scenario(scenario)
    assert verdict.status == "FAIL"
    assert any(reason.startswith(metric) for reason in verdict.reasons), verdict.reasons
