"""The Megatron engine's known upstream defects (engines/megatron/upstream.py), read from megatron-core's source:
planted sources with and without the fix, and the rows the defect can and cannot reach."""

from __future__ import annotations

import pytest

from parity.engines.megatron import upstream
from parity.harness.config.models import model_shape
from parity.harness.config.validate import broken_here, skip_reason
from parity.harness.contract.schema import Scenario

pytestmark = pytest.mark.torch_free

WITHOUT = "class GPTModel:\n    def forward(self, input_ids, position_ids, attention_mask, labels=None):\n"
WITH = WITHOUT.replace("labels=None", "labels=None, padding_mask=None")
MOE = model_shape("tiny-qwen3-moe")
ROW = Scenario(model="tiny-qwen3-moe", strategy="megatron", layout={"cp": 2}, workload={"packing": "packed"},
               tolerance={"expert_load_abs": 0})


def source(text: str):
    return lambda package, relative: text if relative == "core/models/gpt/gpt_model.py" else None


def test_a_release_without_padding_mask_breaks_the_packed_moe_rows_naming_the_file(monkeypatch):
    monkeypatch.setattr(upstream, "_source", source(WITHOUT))
    assert "megatron/core/models/gpt/gpt_model.py" in upstream.routes_alignment_padding(ROW, MOE)
    tp = ROW.model_copy(update={"layout": ROW.layout.model_copy(update={"cp": 1, "tp": 2, "sequence_parallel": True})})
    assert upstream.routes_alignment_padding(tp, MOE) is not None


@pytest.mark.parametrize("update", [
    {"workload": ROW.workload.model_copy(update={"packing": "padded"})},  # padding masked out of the loss rows
    {"layout": ROW.layout.model_copy(update={"cp": 1})},  # no alignment tokens in the stream
    {"tolerance": ROW.tolerance.model_copy(update={"expert_load_abs": None})},  # loads not judged
])
def test_rows_the_defect_cannot_reach_are_not_broken(monkeypatch, update):
    monkeypatch.setattr(upstream, "_source", source(WITHOUT))
    assert upstream.routes_alignment_padding(ROW.model_copy(update=update), MOE) is None


def test_a_dense_model_is_not_broken(monkeypatch):
    monkeypatch.setattr(upstream, "_source", source(WITHOUT))
    assert upstream.routes_alignment_padding(ROW, model_shape("tiny-qwen3")) is None
    assert broken_here(ROW.model_copy(update={"model": "tiny-qwen3"})) is None


def test_a_release_with_padding_mask_breaks_nothing(monkeypatch):
    monkeypatch.setattr(upstream, "_source", source(WITH))
    assert upstream.routes_alignment_padding(ROW, MOE) is None


def test_a_stack_broken_row_skips_as_broken(monkeypatch):
    from parity.harness.config import registry

    spec = registry.spec_for(ROW)
    if spec.missing():
        pytest.skip(f"megatron-core is not installed here: {spec.missing()}")
    monkeypatch.setattr(upstream, "_source", source(WITHOUT))
    assert skip_reason(ROW).startswith("marked broken on this stack: megatron-core's GPTModel.forward takes no")
    assert broken_here(ROW) == upstream.routes_alignment_padding(ROW, MOE)
    monkeypatch.setattr(upstream, "_source", source(WITH))
    assert broken_here(ROW) is None
