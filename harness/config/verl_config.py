"""Engine settings in the field names verl users already have in their YAML, mapped onto the harness layout.

A scenario may carry a `verl:` block (verl's McoreEngineConfig / FSDPEngineConfig / MindSpeedEngineConfig
names) instead of `strategy` + `layout`. The same constraints verl enforces apply: sequence parallel is
forced off at TP=1 (with a warning), `fsdp_size: -1` means the whole data-parallel world.

verl's vocabulary changed twice, and every version is accepted (`vocabulary()` names the one a block uses):
- before PR #6316: `mindspeed_llm` / `mindspeed_mm`, `llm_kwargs` / `mm_kwargs` (rejected with the new name;
  `parity migrate` rewrites them);
- PR #6316 .. #7374: `strategy: mindspeed_megatron` / `mindspeed_fsdp` with `mcore_kwargs` / `fsdp_kwargs`;
- since PR #7374 (the `mindspeed_*` strategies removed): `strategy: megatron` on device npu IS MindSpeed's path
  (verl's Megatron worker imports mindspeed.megatron_adaptor on NPU) and MindSpeed / Megatron settings come as
  `override_transformer_config`, here mapped to the MindSpeed engine and its `mcore_kwargs`.
"""

from __future__ import annotations

import sys
from typing import Any

from parity.harness.config.errors import ScenarioError, did_you_mean
from parity.harness.config.registry import SPECS, canonical

#: verl name -> harness layout field: McoreEngineConfig's parallel sizes are Megatron's own names (the megatron
#: spec's layout_keys), plus FSDPEngineConfig's Ulysses degree
LAYOUT_FIELDS = {**{name: where.removeprefix("layout.") for name, where in SPECS["megatron"].layout_keys.items()},
                 "ulysses_sequence_parallel_size": "ulysses"}
#: verl name -> (harness kwargs block, key)
KWARG_FIELDS = {"use_distributed_optimizer": ("mcore_kwargs", "use_distributed_optimizer"),
                "reshard_after_forward": ("fsdp_kwargs", "reshard_after_forward")}
OTHER_FIELDS = ("strategy", "fsdp_size", "mcore_kwargs", "fsdp_kwargs", "override_transformer_config", "dtype",
                "seed", "n_gpus_per_node", "nnodes", "device")
#: verl's Megatron strategy on device npu runs MindSpeed (verl PR #7374)
NPU_STRATEGIES = {"megatron": "mindspeed_megatron"}
#: retired verl names -> the verl version whose vocabulary they belong to
OLD_NAMES = ("mindspeed_llm", "mindspeed_mm", "llm_kwargs", "mm_kwargs")
KNOWN = (*LAYOUT_FIELDS, *KWARG_FIELDS, *OTHER_FIELDS)
#: verl dtype spellings -> harness dtype
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "float32": "fp32", "fp32": "fp32"}


def translate(raw: dict[str, Any], where: dict[str, str]) -> dict[str, Any]:
    """A raw scenario mapping with a `verl:` block -> the same mapping in harness fields."""
    block = raw.get("verl")
    if block is None:
        return raw
    if not isinstance(block, dict):
        raise ScenarioError("'verl' must be a mapping of verl engine config fields", key="verl", **where)
    for clash in ("strategy", "layout", "engine"):
        if clash in raw:
            raise ScenarioError(f"give the engine either as 'verl' or as '{clash}', not both", key=clash, **where)
    for key in block:
        if key not in KNOWN:
            raise ScenarioError(f"unknown verl engine field{did_you_mean(key, KNOWN)}", key=f"verl.{key}", **where)
    out = {k: v for k, v in raw.items() if k != "verl"}
    device = block.get("device", raw.get("device", "cpu"))
    out["device"] = device
    strategy = canonical(block.get("strategy", "fsdp2"))
    out["strategy"] = NPU_STRATEGIES.get(strategy, strategy) if device == "npu" else strategy
    layout = {LAYOUT_FIELDS[k]: v for k, v in block.items() if k in LAYOUT_FIELDS and v is not None}
    if layout.get("sequence_parallel") and layout.get("tp", 1) == 1:
        print(f"parity: warning: {where['file']}, scenario {where['scenario']}: sequence_parallel forced off "
              "because tensor_model_parallel_size is 1 (as verl does)", file=sys.stderr)
        layout["sequence_parallel"] = False
    nodes = int(block.get("nnodes", 1))
    per_node = block.get("n_gpus_per_node")
    if per_node is not None:
        layout |= {"nodes": nodes, "nproc_per_node": int(per_node)}
    layout["dp"] = _data_parallel(block, layout, nodes * int(per_node) if per_node else None, where)
    out["layout"] = layout
    for key, (kwargs_block, name) in KWARG_FIELDS.items():
        if key in block:
            out.setdefault(kwargs_block, {})[name] = block[key]
    for kwargs_block in ("mcore_kwargs", "fsdp_kwargs"):
        if kwargs_block in block:
            out[kwargs_block] = {**out.get(kwargs_block, {}), **block[kwargs_block]}
    if "override_transformer_config" in block:
        if not isinstance(block["override_transformer_config"], dict):
            raise ScenarioError("'override_transformer_config' must be a mapping of TransformerConfig / MindSpeed "
                                "settings", key="verl.override_transformer_config", **where)
        out["mcore_kwargs"] = {**out.get("mcore_kwargs", {}), **block["override_transformer_config"]}
    if "dtype" in block:
        if str(block["dtype"]) not in DTYPES:
            raise ScenarioError(f"unknown dtype '{block['dtype']}'{did_you_mean(block['dtype'], DTYPES)}",
                                key="verl.dtype", **where)
        out["dtype"] = DTYPES[str(block["dtype"])]
    if "seed" in block:
        out["workload"] = {**out.get("workload", {}), "seed": block["seed"]}
    return out


def _data_parallel(block: dict[str, Any], layout: dict[str, Any], world: int | None, where: dict[str, str]) -> int:
    """dp from fsdp_size (-1 = everything left) or, for Megatron layouts, world / (tp * pp * cp)."""
    model_parallel = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1) * layout.get("ulysses", 1)
    fsdp_size = block.get("fsdp_size", -1)
    if fsdp_size not in (-1, None):
        return int(fsdp_size)
    if world is None:
        return 1
    if world % model_parallel:
        raise ScenarioError(f"n_gpus_per_node * nnodes = {world} is not divisible by the model-parallel size "
                            f"{model_parallel}", key="verl", **where)
    return world // model_parallel


def vocabulary(block: dict[str, Any], device: str | None = None) -> str:
    """Which verl version's names a `verl:` block uses (see the module docstring)."""
    strategy = str(block.get("strategy", ""))
    if any(name in OLD_NAMES for name in (strategy, *block)):
        return "verl before PR #6316 (mindspeed_llm / mindspeed_mm, llm_kwargs / mm_kwargs): run parity migrate"
    if strategy.startswith("mindspeed_"):
        return "verl PR #6316 .. #7374 (mindspeed_megatron / mindspeed_fsdp strategies)"
    if "override_transformer_config" in block or (strategy == "megatron" and
                                                   block.get("device", device) == "npu"):
        return "verl since PR #7374 (strategy megatron + override_transformer_config; MindSpeed on device npu)"
    return "verl engine config (the same in every version)"
