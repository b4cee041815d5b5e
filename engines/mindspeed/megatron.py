"""`mindspeed_megatron`: the Megatron-Core engine with Ascend MindSpeed's megatron adaptor applied.

MindSpeed patches Megatron feature by feature and decides WHICH patches to install from its own argument
namespace (`mindspeed.args_utils.get_full_args()`), parsed from sys.argv when `mindspeed.megatron_adaptor` is
first imported. A harness passes no such argv, so MindSpeed sees context_parallel_size=1, never wraps
`parallel_state.initialize_model_parallel` with its CP group set-up, and CP silently stays 1 (verl PR #5697).
So `prepare_megatron()` — which the Megatron engine calls BEFORE `initialize_model_parallel` — calls
`mindspeed.megatron_adaptor.repatch(...)` with what verl's MindSpeed engine passes and nothing more
(verl/workers/engine/mindspeed/transformer_impl.py `_mindspeed_repatch`: its override config — here the MindSpeed
keys of mcore_kwargs —, `use_flash_attn` defaulting to True, and the CP size when cp > 1), then reads it back. The
rest of the layout reaches Megatron through the TransformerConfig the engine builds, whose arguments MindSpeed's
patched `__init__` puts above its own args (mindspeed/core/megatron_basic/arguments_basic.py). The one thing the
harness adds is its padded data path's need: left-padded rows carry a full mask, which takes MindSpeed's 'general'
mask type; packed rows keep MindSpeed's default 'causal' (TND with the compressed causal mask).

mcore_kwargs are routed by who reads them: keys MindSpeed's parser registers (plus the Megatron-LM training
flags it reads, like use_flash_attn) go to its args — its patched `TransformerConfig.__init__` copies every one
onto the config as well; all other keys are left to the Megatron engine, which routes them to TransformerConfig,
DDP or optimizer config. The routing is a pure function (`plan_mindspeed_args`) so that CPU tests cover it.

Nothing heavy is imported with this module: `MindSpeedMegatronEngine` is built on first access (module
`__getattr__`), importing `mindspeed.megatron_adaptor` BEFORE `parity.engines.megatron` (and so Megatron-Core), as
MindSpeed requires for its pre-import patches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from parity.engines.fused_ops import COUNTER
from parity.engines.mindspeed.env import find_mindspeed, megatron_pairing_problem
from parity.engines.specs import MINDSPEED_MEGATRON
from parity.harness.contract.engine import Engine, EngineContext
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import module_present

#: MindSpeed CP algorithms this engine feeds: the sequence is split by MindSpeed's own `get_batch_on_this_cp_rank`
#: (`cp_split`), and for megatron_cp_algo with the 'general' mask its ring attention takes one mask per KV block.
#: ulysses / hybrid / adaptive algorithms exchange heads or reorder tokens and take other mask forms
#: (mindspeed/core/context_parallel/get_batch_utils.py); kvallgather_cp_algo takes causal masks only (MindSpeed
#: refuses it with 'general' in its own validation).
CP_ALGORITHMS: tuple[str, ...] = ("megatron_cp_algo", "kvallgather_cp_algo")
#: ... and for packed (TND) rows: MindSpeed's ring-causal attention over each sequence's 2·cp chunks, fed by its own
#: per-sequence split (`_get_batch_on_this_cp_rank_in_megatron_cp_eod_padding`); kvallgather's TND path splits
#: each sequence into cp contiguous parts instead (`_get_batch_on_this_cp_rank_in_ulysses_cp`)
PACKED_CP_ALGORITHMS: tuple[str, ...] = ("megatron_cp_algo",)
#: MindSpeed's default `--context-parallel-algo` (mindspeed/features_manager/context_parallel/
#: context_parallel_feature.py): what runs when neither verl nor mcore_kwargs name one
MINDSPEED_CP_ALGO_DEFAULT = "megatron_cp_algo"

#: the core attention MindSpeed patches in place of Megatron's (TE)DotProductAttention for cp > 1, per algorithm
#: (mindspeed/features_manager/context_parallel/context_parallel_feature.py register_patches)
CP_ATTENTION_CLASSES: dict[str, str] = {"megatron_cp_algo": "MindSpeedCPDotProductAttention",
                                        "kvallgather_cp_algo": "TEDotProductAttention"}

#: what verl's `_mindspeed_repatch` passes to MindSpeed whatever the override config says: flash attention on
#: (`repatch_config.setdefault("use_flash_attn", True)`; MindSpeed's CP validation forces it on anyway)
VERL_REPATCH_DEFAULTS: dict[str, Any] = {"use_flash_attn": True}

#: the mask type left-padded rows need: the engine passes its [b, 1, s, s] causal + left-padding mask, and
#: MindSpeed's flash attention maps 'general' to sparse_mode 1 (the given full mask) and its default 'causal' to
#: sparse_mode 2, which requires the compressed 2048x2048 causal mask instead
#: (mindspeed/te/pytorch/attention/dot_product_attention/backend.py get_fa_config): a padding mask with sparse_mode 2
#: breaks npu_fusion_attention's contract (docs/ascend.md, "The emulated lane"). Packed rows need no mask. With
#: cp > 1 the engine also hands the padded rows to MindSpeed's own CP split (`mindspeed_cp_split`), which reads
#: Megatron-LM's data flag `reset_attention_mask` (False: the rows are not packed), an arg verl never sets because
#: it splits its batches itself.
PADDED_MASK_TYPE: dict[str, Any] = {"attention_mask_type": "general"}
PADDED_CP_SPLIT: dict[str, Any] = {"reset_attention_mask": False}

#: TransformerConfig defaults for a mixture-of-experts model, as verl's config converter sets them for every MoE
#: model (verl/models/mcore/config_converter.py, moe_grouped_gemm=True), not in MindSpeed's args: under the TE spec
#: Megatron then builds TEGroupedMLP over MindSpeed's TE grouped-linear stand-ins, which run npu_grouped_matmul and
#: communicate over the EXPERT tensor-parallel group (mindspeed/te/pytorch/module/grouped_linear.py
#: TEGroupedLinear). Without it Megatron builds SequentialMLP over MindSpeed's TEColumn/RowParallelLinear
#: stand-ins, which take the DENSE TP group for expert linears (mindspeed/te/pytorch/module/linear.py): with tp > 1
#: and expert TP 1 each rank's experts all-reduce their own token batches of different sizes over tp (gloo: a
#: collective size mismatch).
MOE_CONFIG_DEFAULTS: dict[str, Any] = {"moe_grouped_gemm": True}



@dataclass(frozen=True, slots=True)
class MindSpeedArgsPlan:
    """Where each setting of a scenario goes."""

    mindspeed_args: dict[str, Any]
    """Set on MindSpeed's args namespace by `repatch()`: what its features read (CP size and algorithm, FA...)."""
    routed: dict[str, str]
    """mcore_kwargs key -> 'mindspeed' (only MindSpeed reads it), 'both' (also a TransformerConfig field) or
    'megatron' (left to the Megatron engine, which routes it to TransformerConfig / DDP / optimizer)."""
    rejected: dict[str, str]
    """mcore_kwargs key -> why it is not applied (the layout owns it): left out of applied_kwargs, so the harness
    fails the scenario as 'dropped engine kwargs'."""


# ---- pure translation (runs on CPU, no mindspeed needed) --------------------------------------------------
def repatch_args(scenario: Scenario) -> dict[str, Any]:
    """What `repatch` gets besides the MindSpeed keys of mcore_kwargs: verl's defaults, the CP size when cp > 1
    (as verl passes it), and the mask type left-padded rows need."""
    args = dict(VERL_REPATCH_DEFAULTS)
    if scenario.layout.cp > 1:
        args["context_parallel_size"] = scenario.layout.cp
    if not scenario.workload.packed:
        args.update(PADDED_MASK_TYPE)
        if scenario.layout.cp > 1:
            args.update(PADDED_CP_SPLIT)
    return args


def plan_mindspeed_args(scenario: Scenario, mindspeed_keys: Collection[str],
                        megatron_keys: Collection[str]) -> MindSpeedArgsPlan:
    """Route the scenario's mcore_kwargs. `mindspeed_keys`: the names MindSpeed's parser registers
    (`vars(get_mindspeed_args(get_defaults=True))`, with their defaults where the values matter); `megatron_keys`:
    TransformerConfig field names."""
    defaults = repatch_args(scenario)
    mindspeed = dict(defaults)
    routed: dict[str, str] = {}
    rejected: dict[str, str] = {}
    for key, value in scenario.mcore_kwargs.items():
        if key in MINDSPEED_MEGATRON.layout_keys:
            rejected[key] = f"set by the scenario's {MINDSPEED_MEGATRON.layout_keys[key]}, not by mcore_kwargs"
        elif key in mindspeed_keys or key in defaults:
            mindspeed[key] = value
            routed[key] = "both" if key in megatron_keys else "mindspeed"
        else:
            routed[key] = "megatron"
    algo = mindspeed.get("context_parallel_algo", MINDSPEED_CP_ALGO_DEFAULT)
    allowed = PACKED_CP_ALGORITHMS if scenario.workload.packed else CP_ALGORITHMS
    if scenario.layout.cp > 1 and algo not in allowed:
        feeds = "per-sequence THD split" if scenario.workload.packed else "load-balanced CP split"
        raise ValueError(f"mcore_kwargs.context_parallel_algo={algo!r}: this engine feeds MindSpeed's {feeds}, "
                         f"which only {', '.join(allowed)} expect{'s' * (len(allowed) == 1)}")
    return MindSpeedArgsPlan(mindspeed_args=mindspeed, routed=routed, rejected=rejected)



# ---- the engine ---------------------------------------------------------------------------------------------
def mindspeed_cp_split(batch: dict[str, Any]) -> dict[str, Any]:
    """A micro-batch's CP share as MindSpeed's CP attention expects it (the Megatron engine's `cp_split` hook).

    The [b, s] tensors go through MindSpeed's own `get_batch_on_this_cp_rank` (for megatron_cp_algo with the
    'general' mask: cp CONTIGUOUS chunks, which its RoPE slice, patched into Megatron, matches). Its ring attention
    then takes the mask as a LIST indexed by KV block: this rank's query rows against each rank's chunk
    (`_get_batch_on_this_cp_rank_in_megatron_cp_general`, `AttentionWithCp.compute_mask`). MindSpeed builds that
    list from one 2-D mask for the whole micro-batch; left-padded rows differ, so each block here is
    [b, 1, s/cp, s/cp] — a shape npu_fusion_attention accepts for every layout but TND. Other mask types keep
    Megatron's form: this rank's query rows against the whole sequence.

    A left-pad query before a row's first real token may attend to nothing; every block then hands the ring's
    merge (`forward_update`) a softmax sum of 0 and it divides 0 by 0, and the NaN reaches real tokens through
    the masked products (0 * NaN). Such a query attends to itself instead, as transformers does for SDPA
    (`AttentionMaskConverter._unmask_unattended`): it is never scored, and no real token attends to it."""
    import torch
    from megatron.core import parallel_state
    from mindspeed.args_utils import get_full_args
    from mindspeed.core.context_parallel.get_batch_utils import get_batch_on_this_cp_rank

    mask = batch["attention_mask"]
    unattended = mask.all(dim=-1, keepdim=True) & torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    mask = mask & ~unattended
    sliced = get_batch_on_this_cp_rank({key: value for key, value in batch.items() if key != "attention_mask"})
    cp, rank = parallel_state.get_context_parallel_world_size(), parallel_state.get_context_parallel_rank()
    held = sliced["positions"][0]
    rows = mask.index_select(2, held.to(mask.device))
    args = get_full_args()
    if cp == 1 or (args.context_parallel_algo, args.attention_mask_type) != ("megatron_cp_algo", "general"):
        return {**sliced, "attention_mask": rows}
    chunks = torch.arange(mask.shape[-1]).chunk(cp)
    if not held.cpu().equal(chunks[rank]):
        raise RuntimeError(f"MindSpeed's general-mask ring attention needs CP rank {rank} to hold positions "
                           f"{chunks[rank].tolist()}, its get_batch_on_this_cp_rank gave {held.tolist()}")
    return {**sliced, "attention_mask": [block.contiguous() for block in rows.chunk(cp, dim=-1)]}


def mindspeed_thd_split(whole: dict[str, Any], cu_seqlens_padded: Any) -> dict[str, Any]:
    """A packed micro-batch's CP share by MindSpeed's own split for packed ("EOD") sequences with its ring-causal
    attention (`get_batch_on_this_cp_rank` takes this branch for reset_attention_mask + causal:
    mindspeed/core/context_parallel/get_batch_utils.py `_get_batch_on_this_cp_rank_in_megatron_cp_eod_padding`):
    per sequence, chunks r and 2cp-1-r of 2·cp, what MindSpeed's ring attention over TND
    (ring_context_parallel.py, CausalEodAttentionStrategy) assumes. It takes the sequence ends as MindSpeed's data
    path stores them, divided by the ring degree (get_batch_utils.py: `actual_seq_len /= get_ring_degree()`)."""
    from mindspeed.core.context_parallel.get_batch_utils import (
        _get_batch_on_this_cp_rank_in_megatron_cp_eod_padding,
        get_ring_degree,
    )

    ends = cu_seqlens_padded[1:].long() // get_ring_degree()
    return _get_batch_on_this_cp_rank_in_megatron_cp_eod_padding(dict(whole), ends)


def mindspeed_provenance(chunks: Any) -> dict[str, Any]:
    """What ran underneath, for the RunRecord: which MindSpeed, how many of its patches and which of its features
    were applied, the attention its patches built into `chunks` (this rank's model chunks), and the fused ops
    called on this rank (rank 0's record)."""
    from mindspeed.args_utils import get_full_args
    from mindspeed.features_manager.features_manager import MindSpeedFeaturesManager
    from mindspeed.patch_utils import MindSpeedPatchesManager

    source = find_mindspeed()
    args = get_full_args()
    features = sorted({f.feature_name for f in MindSpeedFeaturesManager.FEATURES_LIST if f.is_need_apply(args)})
    patches = [name for name, p in MindSpeedPatchesManager.patches_info.items() if p.is_applied]
    return {"mindspeed": {**(source.as_dict() if source else {}), "patches": len(patches),
                          "attention": built_attention(chunks),
                          "features": features, "fused_ops": COUNTER.counts(),
                          "fused_ops_source": "emulated torch_npu" if COUNTER.emulated else "torch_npu"}}


def built_attention(chunks: Any) -> dict[str, Any]:
    """The core-attention and QKV-linear classes (the latter module-qualified: a MindSpeed class there = the TE
    spec's stand-in) MindSpeed's patches instantiated in these model chunks, the CP algorithm and mask type the
    config they hold carries (what their forward reads), and the class MindSpeed put behind Megatron's
    `TEDotProductAttention` name (`te_attention`: which class differs by MindSpeed branch)."""
    import torch

    classes, qkv, algos, masks = set(), set(), set(), set()
    for chunk in chunks:
        for module in chunk.modules():
            core = getattr(module, "core_attention", None)
            # Megatron's (Self)Attention holds the core attention; MindSpeed's TE stand-in nests its own
            if hasattr(module, "linear_qkv") and isinstance(core, torch.nn.Module):
                classes.add(type(core).__qualname__)
                qkv.add(f"{type(module.linear_qkv).__module__}.{type(module.linear_qkv).__qualname__}")
                held = getattr(core, "config", None)
                algos.add(getattr(held, "context_parallel_algo", None))
                masks.add(getattr(held, "attention_mask_type", None))
    te = getattr(sys.modules.get("megatron.core.extensions.transformer_engine"), "TEDotProductAttention", None)
    return {"core_attention": sorted(classes), "linear_qkv": sorted(qkv),
            "te_attention": f"{te.__module__}.{te.__qualname__}" if isinstance(te, type) else None,
            "context_parallel_algo": sorted(map(str, algos)), "attention_mask_type": sorted(map(str, masks))}


class _MindSpeedMegatronMixin:
    """MindSpeed on top of the Megatron engine: checks, repatch before model-parallel init, kwargs routing."""

    ctx: EngineContext
    _mindspeed_plan: MindSpeedArgsPlan
    _mindspeed_effective: dict[str, Any]

    def setup(self) -> None:
        MINDSPEED_MEGATRON.require()
        if problem := megatron_pairing_problem():
            raise RuntimeError(f"mindspeed_megatron: {problem}")
        COUNTER.reset()
        super().setup()  # type: ignore[misc]
        self._verify_context_parallel()

    def run_provenance(self) -> dict[str, Any]:
        """What ran underneath (mindspeed_provenance), over what the Megatron engine records."""
        return {**getattr(super(), "run_provenance", dict)(), **mindspeed_provenance(getattr(self, "model", []))}

    def prepare_megatron(self) -> None:
        """Runs before initialize_model_parallel: repatch MindSpeed with what verl passes (`repatch_args`)."""
        super().prepare_megatron()  # type: ignore[misc]
        from megatron.core.transformer import TransformerConfig
        from mindspeed.args_utils import get_full_args, get_mindspeed_args
        from mindspeed.megatron_adaptor import repatch

        defaults = vars(get_mindspeed_args(get_defaults=True))
        plan = plan_mindspeed_args(self.ctx.scenario, set(defaults),
                                   {f.name for f in dataclasses.fields(TransformerConfig)})
        # every MindSpeed arg reset to its default first: a forked rank may inherit an earlier repatch
        repatch({**defaults, **plan.mindspeed_args})
        full_args = get_full_args()
        effective = {key: getattr(full_args, key, None) for key in plan.mindspeed_args}
        wrong = {k: (v, effective[k]) for k, v in plan.mindspeed_args.items() if effective[k] != v}
        if wrong:
            raise RuntimeError(f"MindSpeed's args did not take the repatch (wanted, got): {wrong}")
        self._mindspeed_plan, self._mindspeed_effective = plan, effective
        self._mask_type = getattr(full_args, "attention_mask_type", None)
        self._cp_algo = getattr(full_args, "context_parallel_algo", MINDSPEED_CP_ALGO_DEFAULT)

    def use_transformer_engine(self) -> bool:
        """The TE spec, always: it is the path NPUs take. MindSpeed's adaptor puts its own stand-ins behind
        Megatron's TE classes (fused norm, swiglu, grouped matmul, flash attention with its CP algorithms), so
        they run, on the device or under the emulated torch_npu."""
        return True

    def cp_split(self) -> Any:
        """With cp > 1, MindSpeed's own CP split and mask form (`mindspeed_cp_split`), not Megatron's."""
        return mindspeed_cp_split if self.ctx.scenario.layout.cp > 1 else None

    def thd_split(self) -> Any:
        """Packed rows with cp > 1: MindSpeed's own per-sequence split (`mindspeed_thd_split`)."""
        return mindspeed_thd_split if self.ctx.scenario.layout.cp > 1 else super().thd_split()  # type: ignore[misc]

    def context_parallel_attention(self) -> type | None:
        """Never the Megatron engine's CPU gather attention: with cp > 1 MindSpeed's own CP attention
        (MindSpeedCPDotProductAttention, patched in for the scenario's context_parallel_algo) must run."""
        return None

    def _mindspeed_only(self) -> set[str]:
        plan = getattr(self, "_mindspeed_plan", None)
        return {k for k, where in plan.routed.items() if where == "mindspeed"} if plan else set()

    def _warn_rejected(self) -> None:
        """The Megatron engine warns about keys no Megatron dataclass has; MindSpeed-only keys ARE applied."""
        rejected = getattr(getattr(self, "routed", None), "rejected", {})
        mine = {k: rejected.pop(k) for k in list(rejected) if k in self._mindspeed_only()}
        try:
            super()._warn_rejected()  # type: ignore[misc]
        finally:
            rejected.update(mine)

    def transformer_config_kwargs(self) -> dict[str, Any]:
        """MindSpeed's patched TransformerConfig.__init__ copies MindSpeed-only keys from its args itself."""
        kwargs = {k: v for k, v in super().transformer_config_kwargs().items()  # type: ignore[misc]
                  if k not in self._mindspeed_only()}
        lay = self.ctx.scenario.layout
        kwargs["sequence_parallel"] = bool(lay.sequence_parallel and lay.tp > 1)
        kwargs["context_parallel_size"] = lay.cp
        if self.arch.num_experts:  # verl's MoE defaults, unless mcore_kwargs (routed to the config above) say otherwise
            kwargs.update({k: v for k, v in MOE_CONFIG_DEFAULTS.items() if k not in self.ctx.scenario.mcore_kwargs})
        return kwargs

    def applied_kwargs(self) -> dict[str, Any]:
        """The Megatron engine's report (TransformerConfig / DDP / optimizer keys), with every key routed to
        MindSpeed read back from what MindSpeed BUILT: the TransformerConfig its patched __init__ produced (it
        copies its args onto the config; the attention and fusion modules read them there), never from the args
        this engine wrote. A key MindSpeed did not carry onto the config is left out: the scenario FAILs with it
        as a dropped kwarg."""
        applied = dict(super().applied_kwargs())  # type: ignore[misc]
        plan = getattr(self, "_mindspeed_plan", None)
        if plan is None:
            return applied
        mcore = {k: v for k, v in applied.get("mcore_kwargs", {}).items() if k not in plan.rejected}
        config = getattr(self, "config", None)
        for key in (k for k, where in plan.routed.items() if where != "megatron"):
            mcore.pop(key, None)
            if key not in getattr(self, "_dropped", ()) and hasattr(config, key):
                mcore[key] = getattr(config, key)
        return {**applied, "mcore_kwargs": mcore} if mcore else applied

    def built_attention(self) -> dict[str, Any]:
        return built_attention(getattr(self, "model", []))

    def _verify_context_parallel(self) -> None:
        """Fail loudly where CP used to stay 1 silently: Megatron's CP group and MindSpeed's ring groups."""
        cp = self.ctx.scenario.layout.cp
        from megatron.core import parallel_state

        if parallel_state.get_context_parallel_world_size() != cp:
            raise RuntimeError(f"context-parallel group has {parallel_state.get_context_parallel_world_size()} "
                               f"ranks, the scenario asks for cp={cp}")
        built, algo = self.built_attention(), self._cp_algo
        if cp > 1 and (built["core_attention"] != [CP_ATTENTION_CLASSES[algo]]
                       or built["context_parallel_algo"] != [algo]):
            raise RuntimeError(f"cp={cp} with {algo}, but the model's core attention is {built['core_attention']} "
                               f"running {built['context_parallel_algo']}: MindSpeed's CP patch did not apply "
                               f"(expected {CP_ATTENTION_CLASSES[algo]})")
        if cp > 1 and algo == "megatron_cp_algo":
            from mindspeed.core.context_parallel import model_parallel_utils

            if model_parallel_utils._CONTEXT_PARALLEL_RANKS_FOR_RING_INTRA_WINDOW is None:
                raise RuntimeError("MindSpeed's ring-attention groups were not built: its CP wrapper of "
                                   "initialize_model_parallel was not installed (repatch came too late?)")


class _MissingMegatronBase(Engine):
    """Stands in when parity.engines.megatron cannot be imported, so this module still imports; fails at setup."""

    import_error = ""

    def setup(self) -> None:
        raise RuntimeError(f"mindspeed_megatron extends the megatron engine, which does not import: "
                           f"{self.import_error}")

    def prepare_megatron(self) -> None:
        """No-op hook, as in the real base."""

    def transformer_config_kwargs(self) -> dict[str, Any]:
        return {}

    def forward(self, batch: Any) -> None:
        raise RuntimeError(self.import_error)

    def train_step(self, batch: Any, old_logprobs: Any, step: int) -> None:
        raise RuntimeError(self.import_error)


def _megatron_base() -> type[Engine]:
    try:
        return importlib.import_module("parity.engines.megatron").MegatronEngine
    except (ImportError, AttributeError) as exc:
        return type("_MissingMegatronBase", (_MissingMegatronBase,),
                    {"__module__": __name__, "import_error": f"{type(exc).__name__}: {exc}"})


@contextlib.contextmanager
def clean_argv() -> Iterator[None]:
    """MindSpeed parses sys.argv into its feature args (`get_mindspeed_args`, cached) when its adaptor is
    imported. A rank inherits its launcher's argv (`pytest -k ...`, `parity run -k ...`); MindSpeed turns '-k'
    into an arg named '' and its patched TransformerConfig.__init__ dies ("Field names must be valid
    identifiers"). The scenario, not the command line, says what MindSpeed turns on: parse an empty one."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def import_adaptor() -> None:
    """Import MindSpeed's megatron adaptor (before Megatron: its pre-import patches), its args parsed from a
    clean command line and cached so that later reads never see the launcher's argv."""
    with clean_argv():
        importlib.import_module("mindspeed.megatron_adaptor")
        importlib.import_module("mindspeed.args_utils").get_mindspeed_args()


def _build_engine_class() -> type[Engine]:
    if module_present("mindspeed.megatron_adaptor") and module_present("torch_npu"):
        COUNTER.install()  # before MindSpeed binds anything
        import_adaptor()
    base = _megatron_base()
    return type("MindSpeedMegatronEngine", (_MindSpeedMegatronMixin, base),
                {"__module__": __name__, "spec": MINDSPEED_MEGATRON,
                 "__doc__": "The Megatron engine with MindSpeed's adaptor, repatched with the scenario's layout "
                            "before model-parallel init."})


def __getattr__(name: str) -> Any:
    """`MindSpeedMegatronEngine` is built on first access (see the module docstring)."""
    if name == "MindSpeedMegatronEngine":
        cls = _build_engine_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
