"""expert_count on config.json dicts and config objects. get_rope_theta on real HF configs built by transformers:
flat, with Llama-3 rope scaling, per attention type,
and in a multimodal text_config. Each expected value is what verl's get_hf_rope_theta returns for that config
(verl/utils/transformers_compat.py: rope_theta on the config or its text_config, else rope_parameters there,
flat or the first nested entry)."""

from __future__ import annotations

import pytest
import transformers

from parity.harness.contract.hf_config import expert_count, get_rope_theta, set_rope_theta

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def _text_level_theta(config, value):
    set_rope_theta(config.text_config, value)
    return config


@pytest.mark.parametrize(("build", "expected"), [
    (lambda: transformers.Qwen3Config(rope_theta=1_000_000.0), 1_000_000.0),
    (lambda: transformers.LlamaConfig(rope_theta=500_000.0, rope_scaling=LLAMA3_SCALING,
                                      max_position_embeddings=131072), 500_000.0),
    (lambda: transformers.MixtralConfig(rope_theta=12.5), 12.5),
    (lambda: _text_level_theta(transformers.Qwen2_5_VLConfig(), 250_000.0), 250_000.0),
    (lambda: _text_level_theta(transformers.Qwen3VLConfig(), 5_000_000.0), 5_000_000.0),
    (lambda: transformers.Gemma3TextConfig(), 10_000.0),  # per attention type: the first entry, as verl
], ids=["qwen3", "llama3-rope-scaling", "mixtral-fractional", "qwen2.5-vl-text_config", "qwen3-vl-text_config",
        "gemma3-nested"])
def test_rope_theta_of_real_configs(build, expected):
    config = build()
    assert get_rope_theta(config) == expected


def test_llama3_scaling_keeps_its_other_parameters():
    config = transformers.LlamaConfig(rope_theta=500_000.0, rope_scaling=LLAMA3_SCALING,
                                      max_position_embeddings=131072)
    params = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert params["rope_type"] == "llama3" and params["factor"] == 8.0


def test_a_config_without_a_rope_base_is_an_error():
    class NoRope:
        pass

    with pytest.raises(AttributeError, match="NoRope has no rope_theta"):
        get_rope_theta(NoRope())


def test_roundtrip_through_set_rope_theta():
    config = transformers.Qwen3Config()
    set_rope_theta(config, 12.5)
    assert get_rope_theta(config) == 12.5


@pytest.mark.parametrize(("config", "experts"), [
    ({"num_experts": 4}, 4),  # Qwen-MoE's config.json
    ({"text_config": {"num_local_experts": 8}, "num_local_experts": 2}, 8),  # a multimodal model's language model
    ({"n_routed_experts": 64, "num_experts": None}, 64),  # DeepSeek's
    (transformers.MixtralConfig(num_local_experts=6), 6),  # a transformers config object
    ({"intermediate_size": 64}, 0),  # dense
])
def test_the_expert_count_reads_every_spelling_from_dicts_and_configs(config, experts):
    assert expert_count(config) == experts
