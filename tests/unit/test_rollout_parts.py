"""The rollout lane's torch-only parts, each with a planted defect and its clean twin: the sync plants
(rollout/faults.py), verl's rollout/actor figures (rollout/metrics.py), the judge's checks and the row schema. The
lane itself (vLLM + trainers) runs in tests/rollout/ (its own venv)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parity.harness.config.errors import ScenarioError
from parity.rollout.faults import Attention, plant, qk_swapped
from parity.rollout.judge import judge
from parity.rollout.metrics import importance_ratio, logprob_diff, probs_diff
from parity.rollout.schema import SyncFault, load_rollout_file

REPO = Path(__file__).resolve().parents[2]
ATTN = Attention(num_heads=4, num_kv_heads=2, head_dim=3)


def _weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {"model.embed_tokens.weight": torch.randn(11, 5, generator=gen),
           "lm_head.weight": torch.randn(11, 5, generator=gen)}
    for i in range(3):
        stem = f"model.layers.{i}."
        out |= {stem + "self_attn.q_proj.weight": torch.randn(12, 5, generator=gen),
                stem + "self_attn.k_proj.weight": torch.randn(6, 5, generator=gen),
                stem + "self_attn.v_proj.weight": torch.randn(6, 5, generator=gen),
                stem + "mlp.gate_proj.weight": torch.randn(8, 5, generator=gen)}
    return out


def test_no_fault_delivers_the_export_unchanged() -> None:
    weights = _weights()
    delivered = plant(weights, (), ATTN)
    assert delivered.keys() == weights.keys()
    assert all(torch.equal(delivered[n], weights[n]) for n in weights)


def _missing(prefix: str):
    def check(weights: dict, delivered: dict) -> None:
        assert not any(n.startswith(prefix) for n in delivered)
        assert all(torch.equal(t, weights[n]) for n, t in delivered.items())
    return check


def _all_bf16(weights: dict, delivered: dict) -> None:
    assert {t.dtype for t in delivered.values()} == {torch.bfloat16}


def _q_and_k_swapped(weights: dict, delivered: dict) -> None:
    for i in range(3):
        stem = f"model.layers.{i}.self_attn."
        assert not torch.equal(delivered[stem + "q_proj.weight"], weights[stem + "q_proj.weight"])
        assert delivered[stem + "k_proj.weight"].shape == weights[stem + "k_proj.weight"].shape
        assert torch.equal(delivered[stem + "v_proj.weight"], weights[stem + "v_proj.weight"])


def _first_shard_duplicated(name: str):
    def check(weights: dict, delivered: dict) -> None:
        gate = delivered[name]
        assert torch.equal(gate[4:], weights[name][:4]) and torch.equal(gate[:4], weights[name][:4])
        assert all(torch.equal(t, weights[n]) for n, t in delivered.items() if n != name)
    return check


@pytest.mark.parametrize("kind, check", [
    ("sync_layer_skipped", _missing("model.layers.1.")),
    ("sync_tied_embedding_skipped", _missing("model.embed_tokens.weight")),
    ("sync_bf16", _all_bf16),
    ("sync_qk_swapped", _q_and_k_swapped),
    ("sync_tp_shard_duplicated", _first_shard_duplicated("model.layers.1.mlp.gate_proj.weight")),
])
def test_each_plant_changes_what_it_names_only(kind: str, check) -> None:
    weights = _weights()
    check(weights, plant(weights, (SyncFault(kind=kind, layer=1),), ATTN))


def test_qk_swap_reads_each_kv_group_as_k_q_v() -> None:
    """Per KV group the fused block is [q (2 heads x 3 rows); k (3); v (3)]: read as [k; q; v], the new k is the
    group's first 3 q rows."""
    q = torch.arange(12.0)[:, None]
    k = 100 + torch.arange(6.0)[:, None]
    v = 200 + torch.arange(6.0)[:, None]
    q2, k2 = qk_swapped(q, k, v, ATTN)
    assert k2[:3, 0].tolist() == [0.0, 1.0, 2.0] and k2[3:, 0].tolist() == [6.0, 7.0, 8.0]
    assert q2[:6, 0].tolist() == [3.0, 4.0, 5.0, 100.0, 101.0, 102.0]


def test_verl_figures_of_identical_log_probs() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 7, generator=gen) * 4
    mask = torch.ones(3, 7)
    mask[2, 5:] = 0
    assert logprob_diff(logp, logp, mask)["max"] == 0
    diff = probs_diff(logp, logp, mask)
    assert diff["training/rollout_probs_diff_max"] == 0
    assert diff["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    ratio = importance_ratio(logp, logp, mask)
    assert ratio["rollout_is_mean"] == pytest.approx(1.0) and ratio["rollout_is_std"] == pytest.approx(0, abs=1e-7)


def test_importance_ratio_of_a_shifted_actor() -> None:
    """The actor 0.1 nats above the rollout on every token: ρ = e^0.1 everywhere; a 1-nat shift on one token is
    truncated at verl's TIS threshold 2 and counted in ratio_fraction_high; padding never counts."""
    rollout = torch.full((2, 4), -2.0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    actor = rollout + 0.1
    ratio = importance_ratio(rollout, actor, mask)
    assert ratio["rollout_is_mean"] == pytest.approx(torch.e ** 0.1)
    assert ratio["rollout_is_ratio_fraction_high"] == 0
    actor[0, 0] += 1.0
    actor[1, 3] += 5.0  # padding
    ratio = importance_ratio(rollout, actor, mask)
    assert ratio["rollout_is_max"] == 2.0
    assert ratio["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 6)


def _row(text: str, tmp_path: Path):
    file = tmp_path / "rows.yaml"
    file.write_text(text)
    return load_rollout_file(file)


BASE = """
defaults:
  trainer: {model: tiny-qwen3-rollout, device: cpu, strategy: hf}
matrix:
"""


def test_judge_names_the_check_that_fails_and_passes_its_twin(tmp_path: Path) -> None:
    row = _row(BASE + "  - {}\n", tmp_path)[0]
    gen = torch.Generator().manual_seed(2)
    mask = torch.ones(2, 5)
    base = -torch.rand(2, 5, generator=gen) * 3
    after = base + 0.3
    clean = dict(rollout_at_1=base, sampled=base, reference_sampled=base, trainer_before=base + 1e-7,
                 trainer_after=after, synced=after + 1e-7, info={})
    assert judge(row, mask, **clean).status == "PASS"
    stale = judge(row, mask, **(clean | {"synced": base}))
    assert stale.status == "FAIL" and [r.split(":")[0] for r in stale.reasons] == ["weight_sync"]
    raw = judge(row, mask, **(clean | {"sampled": base * 0.7}))
    assert [r.split(":")[0] for r in raw.reasons] == ["sampled_logprobs"]
    unmoved = judge(row, mask, **(clean | {"trainer_after": base, "synced": base}))
    assert unmoved.status == "ERROR" and unmoved.reasons[0].startswith("training_moved")


def test_the_cpu_file_parses_and_bad_input_names_the_key(tmp_path: Path) -> None:
    # the device files validate here too (their model paths may be unset)
    for name in ("cpu", "cpu_bf16", "gpu", "ascend_nightly"):
        rows = load_rollout_file(REPO / "scenarios" / "rollout" / f"{name}.yaml")
        assert rows and len({r.id for r in rows}) == len(rows)
    with pytest.raises(ScenarioError, match=r"key 'sampling\.temprature'"):
        _row(BASE + "  - {sampling: {temprature: 0.5}}\n", tmp_path)
    with pytest.raises(ScenarioError, match="key 'trainer'"):
        _row("matrix:\n  - {sync_after_steps: 1}\n", tmp_path)
    with pytest.raises(ScenarioError, match="temperature != 1"):
        _row(BASE + "  - {faults: [{kind: rollout_temperature_not_applied}]}\n", tmp_path)
    with pytest.raises(ScenarioError, match="sync_bf16 plants a bf16 sync into an fp32 run"):
        _row(BASE + "  - {trainer: {dtype: bf16}, faults: [{kind: sync_bf16}]}\n", tmp_path)
    with pytest.raises(ScenarioError, match="limits for fp32 and bf16"):
        _row(BASE + "  - {trainer: {dtype: fp16}}\n", tmp_path)
    with pytest.raises(ScenarioError, match="no export of its weights"):
        _row(BASE + "  - {trainer: {strategy: mindspeed_fsdp}}\n", tmp_path)
    with pytest.raises(ScenarioError, match="unknown strategy"):
        _row(BASE + "  - {trainer: {strategy: vllm}}\n", tmp_path)
