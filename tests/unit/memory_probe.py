"""test_memory's measurement, run in a process forked from the session's warm forkserver as the harness's ranks
are (tests/forked.py). Its own module so that the child imports nothing else of the tests."""

from __future__ import annotations

QWEN3_60M = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)


def measure() -> dict[str, int]:
    """Train the 60 M-parameter Qwen3 two steps: the peak RSS it added and the plan's estimate."""
    import torch
    import transformers

    from parity.harness.config.devices import peak_memory_bytes
    from parity.harness.config.memory import estimate
    from parity.harness.contract.schema import Scenario

    torch.manual_seed(0)
    base = peak_memory_bytes("cpu")  # as the harness reads a CPU rank's peak
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**QWEN3_60M), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 32000, (4, 32))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    scenario = Scenario(model="x", strategy="hf", workload={"batch_size": 4, "prompt_len": 16, "response_len": 16})
    plan = estimate(scenario, {**QWEN3_60M, "model_type": "qwen3"})
    return {"measured": peak_memory_bytes("cpu") - base, "estimated": plan.total}
