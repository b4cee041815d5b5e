"""goldens.yml records only the rows its runner's cards hold: `parity golden record` asks the memory plan of each
row against PARITY_DEVICE_MODEL (the workflow's `card` input, verl's L20 by default) and lists a row it does not hold
as "not attempted" instead of starting it to run out of memory. A golden set's device is a fact of the set: the
nightly's rows name their golden through ${PARITY_GOLDEN_DEVICE:-cuda}."""

from __future__ import annotations

import json

from parity.harness.cli.running import _beyond_the_card
from parity.harness.config.matrix import load_file
from parity.harness.config.models import expand_model_path

#: Qwen3-30B-A3B's config.json shape (the plan reads the config, never the weights)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                 "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
                 "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}


def _scenario(tmp_path, write_yaml, model: str):
    path = write_yaml(f"""\
        defaults: {{device: cuda, dtype: bf16, marks: [golden, cuda],
                    workload: {{batch_size: 16, prompt_len: 512, response_len: 512, steps: 3, loss: grpo}}}}
        matrix:
          - {{model: {model}, strategy: fsdp2, layout: {{dp: 8}}}}
        """)
    [scenario] = load_file(path)
    return scenario


def test_a_row_the_card_cannot_hold_is_not_attempted(tmp_path, write_yaml, monkeypatch):
    checkpoint = tmp_path / "qwen3-30b-a3b"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    scenario = _scenario(tmp_path, write_yaml, str(checkpoint))
    monkeypatch.setenv("PARITY_DEVICE_MODEL", "NVIDIA L20")
    reason = _beyond_the_card(scenario)
    assert reason is not None and reason.startswith("not attempted:") and "L20" in reason, reason
    monkeypatch.setenv("PARITY_DEVICE_MODEL", "NVIDIA H200")  # the clean twin: bigger cards hold it
    assert _beyond_the_card(scenario) is None


def test_a_tiny_row_is_recorded(tmp_path, write_yaml, monkeypatch):
    monkeypatch.setenv("PARITY_DEVICE_MODEL", "NVIDIA L20")
    assert _beyond_the_card(_scenario(tmp_path, write_yaml, "tiny-qwen3")) is None


def test_the_golden_device_is_read_from_the_environment_with_a_default(monkeypatch):
    reference = "$PARITY_GOLDEN_DIR/qwen3-8b__fsdp2__dp8__bf16__${PARITY_GOLDEN_DEVICE:-cuda}"
    monkeypatch.setenv("PARITY_GOLDEN_DIR", "/g")
    monkeypatch.delenv("PARITY_GOLDEN_DEVICE", raising=False)
    assert expand_model_path(reference) == "/g/qwen3-8b__fsdp2__dp8__bf16__cuda"
    monkeypatch.setenv("PARITY_GOLDEN_DEVICE", "")  # an unset repository variable: the default, as a shell reads it
    assert expand_model_path(reference) == "/g/qwen3-8b__fsdp2__dp8__bf16__cuda"
    monkeypatch.setenv("PARITY_GOLDEN_DEVICE", "cpu")
    assert expand_model_path(reference) == "/g/qwen3-8b__fsdp2__dp8__bf16__cpu"
