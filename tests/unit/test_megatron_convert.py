"""HF <-> Megatron weight mapping on its own: no process group, no Megatron import."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parity.engines.megatron.convert import (
    McorePiece,
    ModelArch,
    Shard,
    fuse_qkv,
    grouped_expert_name,
    hf_to_mcore,
    mcore_to_hf,
    sequential_expert_name,
    split_qkv,
    te_name,
)
from parity.engines.megatron.hf_weights import SafetensorsCheckpoint
from parity.harness.config.models import TINY_MODELS, ensure_checkpoint

MODELS = sorted(TINY_MODELS)


def _load(model: str, cache_dir: Path) -> tuple[ModelArch, dict[str, torch.Tensor]]:
    import transformers

    path = ensure_checkpoint(model, cache_dir)
    arch = ModelArch.from_hf_config(transformers.AutoConfig.from_pretrained(path))
    return arch, dict(SafetensorsCheckpoint(path))


def _split(hf: dict[str, torch.Tensor], arch: ModelArch, tp: int, pp: int, vpp: int, ep: int,
           etp: int) -> list[McorePiece]:
    """Every rank's pieces, with the layers dealt out to pp * vpp chunks as Megatron's interleaving does."""
    per_chunk = arch.num_layers // (pp * vpp)
    pieces = []
    for stage in range(pp):
        for virtual in range(vpp):
            first = (virtual * pp + stage) * per_chunk
            layers = {local: first + local for local in range(per_chunk)}
            pre = stage == 0 and virtual == 0
            post = stage == pp - 1 and virtual == vpp - 1
            for tp_rank in range(tp):
                for ep_rank in range(ep):
                    for etp_rank in range(etp):
                        shard = Shard(tp, tp_rank, ep, ep_rank, etp, etp_rank)
                        pieces.append(McorePiece(shard, layers, hf_to_mcore(hf, arch, shard, layers, pre, post)))
    return pieces


LAYOUTS = [(1, 1, 1, 1, 1), (2, 1, 1, 1, 1), (2, 2, 1, 1, 1), (1, 2, 2, 1, 1), (2, 1, 1, 2, 1), (1, 2, 1, 2, 2),
           (2, 1, 1, 4, 2)]


@pytest.mark.parametrize("model", MODELS)
def test_round_trip_is_exact(model: str, cache_dir: Path) -> None:
    arch, hf = _load(model, cache_dir)
    layouts = [layout for layout in LAYOUTS if arch.num_experts or layout[3:] == (1, 1)]  # ep, etp: MoE only
    assert layouts
    for tp, pp, vpp, ep, etp in layouts:
        padded = arch.with_vocab_divisor(128 * tp)
        back = mcore_to_hf(_split(hf, padded, tp, pp, vpp, ep, etp), padded)
        assert sorted(back) == sorted(hf), (model, tp, pp, vpp, ep, etp)
        for name, tensor in hf.items():
            assert torch.equal(back[name], tensor), (model, name, tp, pp, vpp, ep, etp)


@pytest.mark.parametrize("model", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_fused_expert_format_round_trips(model: str, cache_dir: Path) -> None:
    """transformers 5 keeps experts as fused 3-D parameters in memory; both spellings map to the same Megatron."""
    arch, hf = _load(model, cache_dir)
    arch = arch.with_vocab_divisor(256)  # 251 rows: Megatron pads the vocabulary to split it over tp
    fused = mcore_to_hf(_split(hf, arch, 1, 1, 1, 2, 1), arch, expert_format="fused")
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (
        arch.num_experts, 2 * arch.moe_ffn_hidden_size, arch.hidden_size)
    from_fused = _split(fused, arch, 2, 1, 1, 2, 2)
    from_disk = _split(hf, arch, 2, 1, 1, 2, 2)
    for a, b in zip(from_fused, from_disk, strict=True):
        assert a.state.keys() == b.state.keys()
        assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)


def test_arch_reads_each_family(cache_dir: Path) -> None:
    archs = {m: _load(m, cache_dir)[0] for m in MODELS}
    assert archs["tiny-qwen2"].qkv_bias and not archs["tiny-llama"].qkv_bias
    assert archs["tiny-qwen3"].qk_norm and archs["tiny-qwen3"].tied
    assert archs["tiny-qwen3-moe"].num_experts == 4 and archs["tiny-qwen3-moe"].moe_ffn_hidden_size == 40
    assert archs["tiny-mixtral"].moe_ffn_hidden_size == 112 and all(archs["tiny-mixtral"].moe_layers)
    assert archs["tiny-qwen3"].head_dim == 24 != archs["tiny-qwen3"].hidden_size // archs["tiny-qwen3"].num_heads


def test_qkv_is_grouped_per_kv_head() -> None:
    arch = ModelArch("llama", 1, 8, num_heads=4, num_kv_heads=2, head_dim=2, ffn_hidden_size=8, vocab_size=8,
                     padded_vocab_size=8, tied=False, qkv_bias=False, qk_norm=False)
    q = torch.arange(8)[:, None].float()
    k = 100 + torch.arange(4)[:, None].float()
    v = 200 + torch.arange(4)[:, None].float()
    fused = fuse_qkv(q, k, v, arch).flatten().tolist()
    assert fused == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fuse_qkv(q, k, v, arch), arch), (q, k, v), strict=True))
    wrong = fuse_qkv(q, k, v, arch, wrong_interleave=True)
    assert not torch.equal(wrong, fuse_qkv(q, k, v, arch))


def test_tied_output_copy_only_off_the_embedding_stage(cache_dir: Path) -> None:
    arch, hf = _load("tiny-qwen3", cache_dir)
    single = hf_to_mcore(hf, arch, Shard(), {0: 0}, pre_process=True, post_process=True)
    last = hf_to_mcore(hf, arch, Shard(), {0: 3}, pre_process=False, post_process=True)
    assert "output_layer.weight" not in single
    assert torch.equal(last["output_layer.weight"], hf["model.embed_tokens.weight"])


def test_vocab_padding_is_zero_rows(cache_dir: Path) -> None:
    arch, hf = _load("tiny-llama", cache_dir)
    padded = arch.with_vocab_divisor(384)
    shards = [hf_to_mcore(hf, padded, Shard(tp_size=2, tp_rank=r), {}, True, True) for r in range(2)]
    full = torch.cat([s["output_layer.weight"] for s in shards])
    assert full.shape[0] == 384 and torch.equal(full[:251], hf["lm_head.weight"]) and not full[251:].any()


def test_te_names() -> None:
    assert te_name("decoder.layers.0.input_layernorm.weight") == \
        "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"
    assert te_name("decoder.layers.0.pre_mlp_layernorm.weight") == "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"


def test_grouped_gemm_expert_names(cache_dir: Path) -> None:
    """TEGroupedMLP spells local expert j's weights `mlp.experts.linear_fc{1,2}.weight{j}`; Megatron -> HF reads
    either spelling, and other names pass through."""
    name = "decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight"
    assert grouped_expert_name(name) == "decoder.layers.3.mlp.experts.linear_fc1.weight12"
    assert sequential_expert_name(grouped_expert_name(name)) == name
    for other in ("decoder.layers.0.mlp.linear_fc2.weight", "decoder.layers.0.mlp.router.weight"):
        assert grouped_expert_name(other) == other == sequential_expert_name(other)
    arch, hf = _load("tiny-qwen3-moe", cache_dir)
    arch = arch.with_vocab_divisor(256)
    grouped = [McorePiece(p.shard, p.layers, {grouped_expert_name(k): v for k, v in p.state.items()})
               for p in _split(hf, arch, 2, 1, 1, 2, 1)]
    back = mcore_to_hf(grouped, arch)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)


def test_mixed_dense_and_moe_layers_round_trip(tmp_path: Path) -> None:
    """Qwen3-MoE with `mlp_only_layers`: dense layers keep gate/up/down, MoE layers get router and experts."""
    import transformers

    from parity.harness.config.models import tiny_config_dict

    cfg = tiny_config_dict("tiny-qwen3-moe")
    cfg.pop("config_class"), cfg.pop("rope_theta")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3MoeConfig(**{**cfg, "mlp_only_layers": [1]}), dtype=torch.float32)
    model.save_pretrained(tmp_path)
    arch = ModelArch.from_hf_config(model.config, vocab_divisor=256)
    assert arch.moe_layers == (True, False, True, True)
    hf = dict(SafetensorsCheckpoint(tmp_path))
    back = mcore_to_hf(_split(hf, arch, 2, 2, 1, 2, 1), arch)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
