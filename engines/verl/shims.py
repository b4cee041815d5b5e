"""Every device shim the verl engines need on a CPU-only box, in one place. Each goes through verl's own extension
point where verl has one (its platform registry, VERL_ENGINE_DEVICE), changes no numbers (no op, dtype, reduction
or mask is altered: they let CPU tensors through checks written for accelerators), and names the verl or torch
file it bridges; docs/verl.md lists them. On an accelerator none of them is applied.

`select_platform` runs before verl is imported (verl resolves its platform at import: the FSDP engine module reads
`get_device_name()` at module level); `apply` patches torch once verl is imported.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from parity.engines.megatron import compat


@dataclass(frozen=True, slots=True)
class Shim:
    name: str
    bridges: str
    """The upstream file (and line in verl 0.9.1) whose CPU-hostile code it bridges."""
    what: str


PLATFORM = Shim(
    "cpu-platform", "verl/plugin/platform/platform_manager.py:114",
    "verl falls back to the 'nvidia' platform when it finds no accelerator; a CPU platform is registered through "
    "verl's platform registry (engines/verl/cpu_platform.py, loaded by VERL_USE_EXTERNAL_MODULES) and chosen with "
    "VERL_PLATFORM=cpu")
ENGINE_DEVICE = Shim(
    "engine-device", "verl/workers/engine/fsdp/transformer_impl.py:1143, megatron/transformer_impl.py:1171",
    "verl registers its engines for cuda / npu only; VERL_ENGINE_DEVICE (read by EngineRegistry.get_engine_cls, "
    "verl/workers/engine/base.py:405) picks the class registered for the device the scenario emulates")
FSDP1_SYNC = Shim(
    "fsdp1-sync-module-states", "verl/workers/engine/fsdp/transformer_impl.py:444 + "
    "torch/distributed/fsdp/_init_utils.py _check_module_states_for_sync_module_states",
    "verl's FSDP1 path hard-codes sync_module_states=True, and torch refuses CPU tensors for it; the check is "
    "skipped on CPU, the broadcast from rank 0 still runs (gloo broadcasts CPU tensors)")
PINNED_OFFLOAD = Shim(
    "fsdp2-pinned-offload", "verl/workers/engine/fsdp/transformer_impl.py:462",
    "verl's FSDP2 offload_policy hard-codes CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator. On "
    "CPU the policy is built without pinning (where the parameters live and every number is the same)")

CPU_EMPTY_CACHE = Shim(
    "cpu-empty-cache", "verl/utils/fsdp_utils.py:60 (init_fn) and 26 more get_torch_device().empty_cache() calls",
    "torch.cpu has no empty_cache; the CPU allocator keeps no cache to empty, so torch.cpu gets a no-op one")

CPU_RNG_STATE = Shim(
    "cpu-rng-state", "verl/utils/checkpoint/checkpoint_manager.py:218 (load_rng_state)",
    "restoring a checkpoint, verl sets the accelerator's RNG state from the entry named after the device; on the CPU "
    "platform that name is 'cpu', the CPU generator's own entry, which load_rng_state restored a line earlier "
    "(get_rng_state skips the accelerator on 'cpu'). torch.cpu has no set_rng_state: it gets torch.set_rng_state, "
    "so the same state is set again")

CPU_MEMORY_STATS = Shim(
    "cpu-memory-stats", "verl/utils/memory_utils.py aggressive_empty_cache (called by verl/workers/engine_workers.py "
    "ActorRolloutRefWorker.init_model) and TrainingWorker._postprocess_output (perf/max_memory_*_gb metrics)",
    "verl's worker reads the accelerator's allocator statistics for its cleanup log and its memory metrics; torch.cpu "
    "has none (the CPU allocator keeps no device statistics), so torch.cpu gets memory_allocated / memory_reserved / "
    "max_memory_allocated / max_memory_reserved answering 0. Only verl's logs and perf metrics read them; the "
    "harness measures memory itself")

CPU_SHIMS = (PLATFORM, ENGINE_DEVICE, FSDP1_SYNC, PINNED_OFFLOAD, CPU_EMPTY_CACHE, CPU_RNG_STATE, CPU_MEMORY_STATS)

_applied: list[str] = []


def select_platform(device: str, engine_device: str) -> list[str]:
    """Before verl is imported: on CPU, verl's platform is the harness's CPU platform; verl's engine registry picks
    the class registered for `engine_device` ('cuda', or 'npu' for verl's MindSpeed engine)."""
    if device != "cpu":
        return []
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(
        dict.fromkeys([*filter(None, os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")),
                       "parity.engines.verl.cpu_platform"]))
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ["VERL_ENGINE_DEVICE"] = engine_device
    return [PLATFORM.name, ENGINE_DEVICE.name]


def platform_problem(device: str) -> str | None:
    """Whether verl resolved the platform this process asked for (a forkserver that imported verl for another
    device would hand its ranks the wrong one)."""
    from verl.utils.device import get_device_name

    resolved = get_device_name()
    wanted = "cpu" if device == "cpu" else device
    if resolved != wanted:
        return f"verl resolved its platform to {resolved!r}, the scenario runs on {device!r}"
    return None


def apply(device: str) -> list[str]:
    """The torch-level shims, once verl is imported; returns the names applied (for the record's provenance)."""
    if device != "cpu":
        return []
    if not _applied:
        _skip_fsdp1_sync_device_check()
        _unpinned_offload_policy()
        _cpu_empty_cache()
        _cpu_rng_state()
        _cpu_memory_stats()
        _applied.extend([FSDP1_SYNC.name, PINNED_OFFLOAD.name, CPU_EMPTY_CACHE.name, CPU_RNG_STATE.name,
                         CPU_MEMORY_STATS.name])
    return list(_applied)


def _skip_fsdp1_sync_device_check() -> None:
    from torch.distributed.fsdp import _init_utils

    def check(module_states: list[Any]) -> None:
        return None

    _init_utils._check_module_states_for_sync_module_states = check


def _unpinned_offload_policy() -> None:
    import torch.distributed.fsdp as fsdp
    from verl.workers.engine.fsdp import transformer_impl

    original = fsdp.CPUOffloadPolicy

    def unpinned(pin_memory: bool = True) -> Any:
        return original(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = unpinned


def _cpu_empty_cache() -> None:
    import torch

    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None


def _cpu_rng_state() -> None:
    import torch

    if not hasattr(torch.cpu, "set_rng_state"):
        torch.cpu.set_rng_state = torch.set_rng_state


def _cpu_memory_stats() -> None:
    import torch

    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda *args, **kwargs: 0)


# ---- verl's Megatron engine (megatron-core through mbridge) on a CPU-only box -----------------------------------
MEGATRON_CPU = Shim(
    "megatron-core-cpu", "megatron/core (each place listed in engines/megatron/cpu_compat.py), "
    "mbridge/core/util.py:151 (model.cuda()), mbridge/core/bridge.py:321, "
    "verl/workers/engine/megatron/utils.py:35 (model_parallel_cuda_manual_seed)",
    "the project's own megatron-core CPU shim (engines/megatron/cpu_compat.py CpuCompat), applied before verl builds "
    "its engine and restored at teardown: Megatron's CUDA RNG tracker on the CPU generator, `.cuda()` / "
    "device='cuda' / pin_memory onto the CPU, `Tensor.type()` answering CUDA type names (Megatron's optimizer "
    "dispatches on them), null streams and events, gloo gathers of unequal sizes, the torch norm under "
    "sequence parallelism (its weights tagged sequence_parallel, so their gradients are summed over TP as TE's "
    "norms are). Megatron's optimizer runs unpatched (its torch-AdamW resume is a broken row)")
MBRIDGE_LOCAL_SPEC = Shim(
    "mbridge-local-spec", "mbridge/core/llm_bridge.py:150",
    "mbridge builds Transformer Engine's layer spec unconditionally (use_transformer_engine=True) and TE needs CUDA: "
    "on CPU it builds Megatron's local spec (torch RMSNorm, local core attention) through the project's "
    "engines/megatron/model.py layer_spec, with the core attention below; a MoE layer's experts are Megatron's "
    "TEGroupedMLP over a plain-torch grouped linear under TE's names (engines/verl/cpu_experts.py: mbridge maps "
    "experts only as linear_fc1.weight<j>, mbridge/core/bridge.py load_weights)")
THD_ATTENTION = Shim(
    "thd-core-attention", "megatron/core/transformer/dot_product_attention.py:153 (local attention refuses "
    "packed_seq_params) against verl/models/mcore/util.py preprocess_thd_engine (use_remove_padding)",
    "verl's packed path hands the core attention THD micro-batches with cu_seqlens, which only TE's attention takes; "
    "on CPU the local core attention hands them to the project's cu_seqlens-aware core attention "
    "(engines/megatron/cp_attention.py THDAttention: causal within each sequence, K/V gathered over CP)")
MBRIDGE_NORM_NAMES = Shim(
    "mbridge-local-norm-names", "mbridge/models/qwen2.py:27,52 (and llama.py, mixtral.py, qwen2moe.py), read by "
    "mbridge/core/bridge.py:649 _weight_name_mapping_mcore_to_hf",
    "mbridge maps the HF layer norms onto TE's fused names (self_attention.linear_qkv.layer_norm_weight, "
    "mlp.linear_fc1.layer_norm_weight); the local spec holds the same weights as input_layernorm / "
    "pre_mlp_layernorm. A local name mbridge does not know is translated to the fused one: the same checkpoint "
    "tensor lands in the same place")
BSHD_MASK = Shim(
    "bshd-causal-mask", "verl/models/mcore/util.py:708-716 (preprocess_bshd_engine) against "
    "megatron/core/transformer/dot_product_attention.py:142 (and TE's causal DotProductAttention, which ignores the "
    "mask)",
    "verl's padded (BSHD) path passes a [b, s] mask, True = real token, each row right-padded; TE's causal attention "
    "(what verl runs on GPUs) ignores it, Megatron's local attention would read it as True = masked out and "
    "broadcast it wrongly. The local core attention checks that the mask is exactly that right-padded form and "
    "attends causally without it, as TE does: every real token sees the same keys, since padding only follows "
    "them. Nor does it take Megatron's CUDA softmax kernel, which TE's attention never runs and mbridge's "
    "masked_softmax_fusion would pick whenever the lengths fit its size rule "
    "(megatron/core/fusions/fused_softmax.py is_kernel_available)")
NO_TOKENIZER = Shim(
    "checkpoint-without-tokenizer", "verl/workers/engine/megatron/transformer_impl.py:1348,1405",
    "verl's Megatron forward reads model_config.tokenizer.pad_token_id (only a vision model uses it); the harness's "
    "tiny checkpoints have no tokenizer, so an object carrying the HF config's pad_token_id stands in, set once the "
    "engine is built: verl's checkpoint manager (transformer_impl.py:638) keeps the tokenizer it finds then as the "
    "processing class it saves, and finds none, as for any checkpoint without a tokenizer")

EMULATED_NPU_AVAILABLE = Shim(
    "emulated-npu-available", "verl/utils/device.py:62 (is_npu_available, read once at import)",
    "the emulated torch_npu (tests/emulated_npu) reports no device, so that torch's accelerator stays the CPU; verl "
    "picks its Ascend code paths (the B1SS mask of npu_fusion_attention, MindSpeed's packed-sequence setup in "
    "verl/models/mcore/util.py) from torch.npu.is_available() when it is imported. verl is imported with that "
    "answering True, so it takes the paths it takes on an Ascend device; only in the emulated lane")

FAST_ALIASES_WITHOUT_TORCHVISION = Shim(
    "transformers-alias-modules", "transformers/__init__.py:803-847 (5.10: backward-compatibility alias modules, "
    "`*_fast`, import their target on any attribute lookup) against mindspeed/patch_utils.py:126 (hasattr on every "
    "module in sys.modules, at adaptor import and at every repatch)",
    "verl 0.9.1 pins transformers < 5.11, whose alias modules (transformers.image_processing_utils_fast, "
    "transformers.models.*.image_processing_*_fast, ...) import an image processor on any attribute lookup, and "
    "those need torchvision (no CPU build of it on PyPI); MindSpeed probes every loaded module for each function "
    "it patches, so its adaptor import fails (`range_push`). Where torchvision is missing, the alias modules "
    "(no file, a module-level __getattr__) leave sys.modules while verl's MindSpeed engine runs and come back at "
    "teardown; nothing in verl, mbridge or MindSpeed imports them. Only in the emulated lane")

FRESH_OPTIMIZER_STATE = Shim(
    "fresh-distributed-optimizer-state", "megatron/core/optimizer/distrib_optimizer.py:640-642 (state_dict, "
    "without Apex / TE) reached from :1246 (sharded_state_dict) by verl/utils/checkpoint/"
    "megatron_checkpoint_manager.py:945 (_build_optimizer_state_dict on load)",
    "without Transformer Engine or Apex (no CPU build) Megatron's distributed optimizer runs torch's AdamW, which "
    "allocates its state (and the step count the loader asserts) only at its first step; a fresh process loading "
    "verl's checkpoint has taken none. Before verl's load, each such inner optimizer steps once with zero gradients "
    "at lr 0 and weight decay 0 (the project's engines/megatron/compat.py allocate_optimizer_state: nothing moves), "
    "and the load overwrites moments, main params and step counts. TE's FusedAdam keeps the step in its param "
    "groups and needs none of this")

MODEL_ALREADY_ON_DEVICE = Shim(
    "megatron-model-on-the-only-device", "verl/workers/engine/megatron/transformer_impl.py:791-793 (save_checkpoint) "
    "into verl/utils/megatron_utils.py:827 (load_megatron_model_to_gpu)",
    "before a save verl 'loads the model to the GPU' whenever its parameters are on the CPU, taking that as a sign of "
    "param offload; on a CPU-only box they always are, and the load reads each grad buffer's param_data, which "
    "Megatron allocates only for the distributed optimizer (AttributeError without it; with it, the grad buffers "
    "are zeroed between the step and the save). On the CPU platform, with offloading refused, there is nothing to "
    "load: verl's Megatron engine skips it, as on an accelerator without offload")

MEGATRON_RNG_SEED = Shim(
    "megatron-rng-seed-on-cpu", "verl/workers/engine/megatron/utils.py set_random_seed (called by "
    "verl/workers/engine/megatron/transformer_impl.py MegatronEngine.__init__)",
    "verl seeds Megatron's model-parallel RNG tracker (tensor_parallel.model_parallel_cuda_manual_seed, which "
    "Megatron's layers fork at build) only where it finds an accelerator. verl main tests `is_cuda_available or "
    "is_npu_available` and skips it on CPU; verl 0.9.1 tests the function object `is_device_available` (always true) "
    "and seeds it on CPU too. After verl's own set_random_seed, on verl's CPU platform, a tracker verl left unseeded "
    "is seeded with the same call verl makes on an accelerator, with verl's seed (the tracker runs on the CPU "
    "generator under megatron-core-cpu). Needed by verl main; a no-op on 0.9.1, which seeds it itself")

MEGATRON_CPU_SHIMS = (MEGATRON_CPU, MEGATRON_RNG_SEED, MBRIDGE_LOCAL_SPEC, MBRIDGE_NORM_NAMES, BSHD_MASK,
                      THD_ATTENTION, NO_TOKENIZER, EMULATED_NPU_AVAILABLE, FAST_ALIASES_WITHOUT_TORCHVISION,
                      FRESH_OPTIMIZER_STATE,
                      MODEL_ALREADY_ON_DEVICE)


def hide_transformers_aliases() -> dict[str, Any]:
    """transformers' alias modules out of sys.modules where torchvision is missing (FAST_ALIASES_WITHOUT_TORCHVISION);
    returns them, for `sys.modules.update` at teardown."""
    import importlib.util
    import sys

    if importlib.util.find_spec("torchvision") is not None:
        return {}
    hidden = {name: module for name, module in list(sys.modules.items())
              if name.startswith("transformers.") and getattr(module, "__file__", "") is None
              and "__getattr__" in getattr(module, "__dict__", {})}
    for name in hidden:
        del sys.modules[name]
    return hidden


def apply_megatron(device: str, local_spec: bool = True) -> tuple[list[str], Any]:
    """verl's Megatron engine on CPU, once verl is imported and before verl builds its engine: returns the names
    applied and the object whose `restore()` undoes them (teardown), or ([], None) off CPU. `local_spec` False
    keeps mbridge's TE spec (under MindSpeed its TE classes are MindSpeed's stand-ins, which run on CPU)."""
    if device != "cpu":
        return [], None
    patches = _megatron_cpu_class()(local_spec)
    patches.apply()
    from verl.utils.device import get_device_name

    applied = [MEGATRON_CPU, *([MODEL_ALREADY_ON_DEVICE, MEGATRON_RNG_SEED] if get_device_name() == "cpu" else [])]
    if local_spec:
        applied += [MBRIDGE_LOCAL_SPEC, MBRIDGE_NORM_NAMES, BSHD_MASK]
        if _thd_attention_class() is not None:
            applied.append(THD_ATTENTION)
    return [s.name for s in applied], patches


def fresh_optimizer_state(optimizer: Any, device: str) -> list[str]:
    """Before verl's engine loads its checkpoint on CPU: the fresh distributed optimizer's torch state allocated
    (FRESH_OPTIMIZER_STATE); returns the name when it allocated anything."""
    if device != "cpu":
        return []
    return [FRESH_OPTIMIZER_STATE.name] if compat.allocate_optimizer_state(optimizer) else []


def import_verl_as_on_npu() -> list[str]:
    """Under the emulated torch_npu: import verl with torch.npu.is_available() answering True (see
    EMULATED_NPU_AVAILABLE). A verl already imported keeps what it read then: refused."""
    import sys

    import torch

    if not getattr(sys.modules.get("torch_npu"), "EMULATED", False):
        return []
    if "verl.utils.device" in sys.modules:
        raise RuntimeError("verl was imported before the emulated NPU was announced to it (a forkserver that "
                           "preloaded verl?): its NPU code paths are decided at import")
    answer = torch.npu.is_available
    torch.npu.is_available = lambda: True
    try:
        import verl.utils.device
        import verl.workers.engine  # noqa: F401
    finally:
        torch.npu.is_available = answer
    return [EMULATED_NPU_AVAILABLE.name]


def tokenizer_stand_in(model_config: Any) -> list[str]:
    """A checkpoint without a tokenizer: the attribute verl's Megatron forward reads, from the HF config."""
    if getattr(model_config, "tokenizer", None) is not None:
        return []
    from types import SimpleNamespace

    model_config.tokenizer = SimpleNamespace(pad_token_id=getattr(model_config.hf_config, "pad_token_id", None))
    return [NO_TOKENIZER.name]


@functools.cache
def _megatron_cpu_class() -> type:
    from parity.engines.megatron.cpu_compat import CpuCompat

    class MegatronCpu(CpuCompat):
        """The project's megatron-core CPU shim plus mbridge's TE assumptions; restore() undoes both."""

        def __init__(self, local_spec: bool) -> None:
            super().__init__()
            self.local_spec = local_spec

        def apply(self) -> None:
            super().apply()
            from verl.workers.engine.megatron import transformer_impl

            self._set(transformer_impl, "load_megatron_model_to_gpu",
                      _on_the_only_device(transformer_impl.load_megatron_model_to_gpu))
            self._set(transformer_impl, "set_random_seed", _seeding_the_tracker(transformer_impl.set_random_seed))
            if not self.local_spec:
                return
            from mbridge.core import bridge, llm_bridge

            self._set(llm_bridge.LLMBridge, "_get_transformer_layer_spec", _local_layer_spec)
            self._set(bridge.Bridge, "_weight_name_mapping_mcore_to_hf",
                      _local_norm_names(bridge.Bridge._weight_name_mapping_mcore_to_hf))

    return MegatronCpu


def _on_the_only_device(original: Any) -> Any:
    """verl's load_megatron_model_to_gpu as verl's Megatron engine calls it, a no-op on verl's CPU platform
    (MODEL_ALREADY_ON_DEVICE)."""
    from verl.utils.device import get_device_name

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        return None if get_device_name() == "cpu" else original(*args, **kwargs)

    return load


def _seeding_the_tracker(original: Any) -> Any:
    """verl's set_random_seed as verl's Megatron engine calls it, then, on verl's CPU platform, the tracker seeding
    verl does on an accelerator where verl skipped it (MEGATRON_RNG_SEED)."""
    from verl.utils.device import get_device_name

    @functools.wraps(original)
    def seeded(seed: int, *args: Any, **kwargs: Any) -> Any:
        result = original(seed, *args, **kwargs)
        if get_device_name() == "cpu":
            from megatron.core import tensor_parallel

            if not tensor_parallel.get_cuda_rng_tracker().get_states():
                tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return result

    return seeded


#: local-spec norm name -> the TE fused name mbridge's mappings use for the same weight
_LOCAL_NORMS = {".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
                ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight"}


def _local_norm_names(original: Any) -> Any:
    def mapping(self: Any, mcore_weights_name: str) -> list[str]:
        try:
            return original(self, mcore_weights_name)
        except NotImplementedError:
            for local, fused in _LOCAL_NORMS.items():
                if mcore_weights_name.endswith(local):
                    return original(self, mcore_weights_name.removesuffix(local) + fused)
            raise

    return mapping


def _local_layer_spec(self: Any, vp_stage: int | None = None) -> Any:
    """mbridge's LLMBridge._get_transformer_layer_spec with the local spec (same checks, same vp_stage handling)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from parity.engines.megatron.model import layer_spec

    assert self.config.normalization == "RMSNorm", "only RMSNorm is supported for now"  # as mbridge asserts
    self.has_vp_stage = compat.takes(get_gpt_decoder_block_spec, "vp_stage")
    from parity.engines.verl.cpu_experts import grouped_experts

    attention = _core_attention_class() if self.config.context_parallel_size == 1 else _cp_core_attention_class()
    block = layer_spec(self.config, False, vp_stage, attention)
    return grouped_experts(block) if self.config.num_moe_experts else block


@functools.cache
def _core_attention_class() -> type:
    """Megatron's local DotProductAttention taking verl's padded (BSHD) mask as TE's causal attention does."""
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class VerlCoreAttention(DotProductAttention):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # TE's attention, which this stands in for, never runs Megatron's CUDA softmax kernel; mbridge's
            # config leaves masked_softmax_fusion on, and FusedScaleMaskSoftmax takes the kernel whenever the
            # lengths fit its size rule (is_kernel_available: sq, sk and b x heads multiples of 4)
            self.scale_mask_softmax.scaled_masked_softmax_fusion = False
            packed = _thd_attention_class()
            self.packed = None if packed is None else packed(*args, **kwargs)

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, attn_mask_type: Any = None,
                    attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
            if packed_seq_params is not None:
                if self.packed is None:
                    raise NotImplementedError(f"packed (THD) sequences: {THD_MISSING}")
                return self.packed(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
                if self.attn_mask_type != AttnMaskType.causal:
                    raise ValueError(f"a [b, s] padding mask with {self.attn_mask_type}: only causal attention "
                                     "may drop it")
                if not _right_padded(attention_mask):
                    raise ValueError("the [b, s] attention mask is not verl's right-padded True = real-token form")
                attention_mask = None
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)

    return VerlCoreAttention


@functools.cache
def _cp_core_attention_class() -> type:
    """Under context parallelism Megatron's local DotProductAttention cannot even be built (it asserts cp == 1):
    packed (THD) micro-batches go to the project's CPU core attention, which all-gathers K/V over the CP group for
    verl's per-sequence split (chunks r and 2cp-1-r of each sequence: verl/models/mcore/util.py
    preprocess_thd_engine); verl's padded CP path has no CPU attention here and is refused."""
    packed = _thd_attention_class()
    if packed is None:
        raise NotImplementedError(f"context parallelism on CPU: {THD_MISSING}")

    class VerlCPCoreAttention(packed):  # type: ignore[misc, valid-type]
        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, attn_mask_type: Any = None,
                    attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
            if packed_seq_params is None:
                raise NotImplementedError("verl's padded (BSHD) path under context parallelism: no CPU core "
                                          "attention takes it (model.use_remove_padding: true packs the batch)")
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)

    return VerlCPCoreAttention


THD_MISSING = ("Megatron's local attention refuses them (dot_product_attention.py:153) and this tree has no "
               "cu_seqlens-aware CPU core attention (engines/megatron/cp_attention.py THDAttention)")


def _thd_attention_class() -> type | None:
    """The project's cu_seqlens-aware CPU core attention for packed (THD) micro-batches, where this tree has it."""
    from parity.engines.megatron import cp_attention

    return getattr(cp_attention, "THDAttention", None)


def _right_padded(mask: Any) -> bool:
    """Every row is real tokens (True) followed only by padding (False), with at least one real token."""
    import torch

    real = mask.bool()
    lengths = real.sum(dim=1)
    expected = torch.arange(real.shape[1], device=real.device)[None, :] < lengths[:, None]
    return bool((real == expected).all()) and bool((lengths > 0).all())
