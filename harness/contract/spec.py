"""EngineSpec: everything the harness needs to know about an engine BEFORE running it, stated once.

A spec is small, declarative and torch-free, so that validation, `parity list --why`, `parity plan`, the
forkserver preload and the kwargs check all read the same facts without importing an engine. Built-in specs live
in `parity.engines.specs`; a third-party engine may carry one as its class attribute `spec` (optional).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from parity.harness.contract.schema import RL_STEP_FIELDS, LossAggMode

#: every layout dimension a Layout has (what `dims` may name)
LAYOUT_DIMS = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "ulysses", "sequence_parallel")
KWARGS_BLOCKS = ("mcore_kwargs", "fsdp_kwargs", "engine_kwargs", "actor_rollout_ref")
DEVICES = ("cpu", "cuda", "npu")
DTYPES = ("fp32", "bf16", "fp16")
#: how an engine may feed the workload's rows (Workload.packing)
PACKINGS = ("padded", "packed")
#: what an engine's own checkpoint can do (Engine.save_checkpoint / load_checkpoint, Engine.convert_checkpoint)
CHECKPOINTS = ("resume", "convert")
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


def module_present(name: str) -> bool:
    """Whether `name` (dotted) can be imported, found without importing it: importing torch_npu without CANN
    breaks torch, and MindSpeed's adaptor patches torch on import."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        try:
            if importlib.util.find_spec(".".join(parts[:depth])) is None:
                return False
        except (ModuleNotFoundError, ValueError):
            return False
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class Requirement:
    """A package an engine needs: an importable module and, optionally, a distribution version range."""

    module: str
    """Dotted module that must be importable (e.g. 'megatron.core', 'mindspeed.fsdp')."""
    why: str
    """What to tell the user when it is missing (how to get it)."""
    distribution: str | None = None
    """pip distribution whose installed version must lie in `versions` (None: no version check)."""
    versions: str = ""
    """PEP 440 specifier set, e.g. '>=0.12.1,<0.17'."""

    def __post_init__(self) -> None:
        try:
            SpecifierSet(self.versions)
        except InvalidSpecifier as exc:
            raise ValueError(f"requirement {self.module}: bad version range {self.versions!r}: {exc}") from None

    def problem(self) -> str | None:
        """Why this requirement is not met here (None: it is)."""
        if not module_present(self.module):
            return self.why
        if self.distribution is None or not self.versions:
            return None
        try:
            installed = md.version(self.distribution)
        except md.PackageNotFoundError:
            return None  # importable from a source tree (e.g. PYTHONPATH): nothing to compare
        if installed not in SpecifierSet(self.versions, prereleases=True):
            return f"{self.distribution} {installed} is installed; this engine supports {self.versions}"
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryTraits:
    """How an engine holds a model, for the per-rank memory plan (harness/config/memory.py)."""

    sharding: Literal["replicated", "fully_sharded", "model_parallel"] = "replicated"
    """replicated: a full copy per rank; fully_sharded: parameters, gradients and optimizer states sharded over
    the world (FSDP, with the layer being computed gathered); model_parallel: Megatron-Core's way, tp / pp / ep
    shard the weights, the distributed optimizer (mcore_kwargs.use_distributed_optimizer) shards optimizer states
    over dp x cp, and mcore_kwargs set recompute and optimizer offload."""
    load: Literal["replicated", "rank0_broadcast", "sharded_read"] = "replicated"
    """How it loads a checkpoint: every rank materialises the whole model on its device, then shards
    (replicated); rank 0 reads it into host memory, the others build on the meta device, and each tensor is
    broadcast and sharded (rank0_broadcast, verl's FSDP engines); every rank reads only the tensors of its own
    shard from the safetensors files (sharded_read)."""
    micro_batch_rows: str | None = None
    """'module:function(scenario) -> int', torch-free: rows per micro-batch; None: a rank's rows in one pass."""
    grad_buffer: bool = False
    """Gradients live in one buffer for the whole step (Megatron DDP's main_grad buffer) instead of being created
    during backward, as torch's are after zero_grad sets them to None."""
    cpu_layer_factor: float = 1.0
    """What the engine's CPU path saves per token and layer, relative to the count for fused layers (flash
    attention, fused norms and SwiGLU) the plan makes for accelerators (benchmarks/memory_plan.py measures it).
    Megatron's local layer spec on CPU keeps each norm's output, the residual sums, the repeated GQA keys / values
    and the unfused SwiGLU's pieces."""
    cpu_attention_matrix: bool = False
    """Its CPU path materialises each layer's attention score matrix (Megatron's local attention) instead of
    computing attention in blocks."""
    scored: Literal["all", "response"] = "all"
    """Positions whose log-probs and entropy it computes from the logits (the shared loss,
    harness/contract/losses.py): every position, or the response only (the hf engine slices them first)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Baseline:
    """A three-way lane's baseline (Scenario.baseline): the reference engine at the candidate's dtype and device."""

    label: str
    """What the baseline's run is called (its cache entry and run id say `baseline-<label>`)."""
    kwargs: Mapping[str, Any]
    """The settings it runs with, in the reference engine's kwargs block."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReferenceRecipe:
    """How the reference engine (one built-in engine has this recipe) computes the runs others are judged
    against: `reference: hf_fp32` is a run of it in fp32 on CPU, a `baseline` a run of it with that baseline's
    kwargs."""

    kwargs_block: str
    """The kwargs block a baseline's settings go into."""
    baselines: Mapping[str, Baseline]
    """Baseline name (what a scenario's `baseline` says) -> the baseline."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "baselines", MappingProxyType(dict(self.baselines)))


@dataclass(frozen=True, kw_only=True, slots=True)
class VerlNames:
    """How verl's trainer config names this engine: a `verl:` block (engines/verl/vocabulary.py) whose
    strategy is this engine's name, or one of its aliases, becomes a scenario of this engine."""

    family: str
    """verl's engine family (its `actor.strategy` vocabulary), in the refusals' messages."""
    block: str
    """The block under verl's `actor_rollout_ref.actor` that holds this family's engine settings."""
    config: str
    """verl's config class of that block (verl/workers/config/engine.py): engines/verl/blocks.py keeps a
    rule per key of it."""
    implied: bool = False
    """The engine a `verl:` block without a strategy means when it carries this family's block."""
    default: bool = False
    """The engine a `verl:` block without a strategy and without an engine block means (verl's default
    actor.strategy)."""
    on_npu: str | None = None
    """The engine verl's same strategy runs on device npu (verl PR #7374: `strategy: megatron` on NPU is
    MindSpeed's path)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineSpec:
    """The facts about one engine. Every field has one home: here."""

    name: str
    """Strategy name scenarios use (`strategy: fsdp2`)."""
    engine: str
    """Import path of the Engine class, 'package.module:Class'."""
    summary: str = ""
    """One line for `parity list` / docs."""
    aliases: tuple[str, ...] = ()
    """Other names that mean this engine (e.g. verl's `fsdp` for `fsdp2`)."""
    retired: Mapping[str, str] = field(default_factory=dict)
    """Names this engine had before -> why it was renamed; rejected with the new spelling, rewritten by
    `parity migrate`."""
    dims: frozenset[str] = frozenset()
    """Layout dimensions the engine implements (see LAYOUT_DIMS); a layout using another one is bad input."""
    kwargs_blocks: tuple[str, ...] = ()
    """Scenario kwargs blocks the engine reads; a block given to an engine that does not read it is bad input,
    and each key of these blocks must come back from `applied_kwargs()`."""
    layout_keys: Mapping[str, str] = field(default_factory=dict)
    """Kwargs keys the scenario's layout / workload owns -> where to set them instead ('layout.tp'). The engine
    never applies them, so the kwargs check fails a scenario that gives one."""
    rules: str | None = None
    """'module:function(scenario, shape) -> [(key, message)]': engine-specific layout rules, torch-free."""
    prepare: str | None = None
    """'module:function(raw: dict) -> (raw, [(key, message)])': turns one expanded scenario mapping into schema
    fields before validation, torch-free (the verl engines flatten their verl config tree and reconcile the verl
    keys that restate a scenario field, e.g. `actor.optim.lr` and `workload.lr`); a message is bad input."""
    loss_agg_modes: tuple[str, ...] = ("token-mean",)
    """Workload loss aggregations the engine implements (see Workload.loss_agg_mode)."""
    rl_step: tuple[str, ...] = ()
    """Workload fields of verl's RL step (schema.RL_STEP_FIELDS) the engine implements away from their defaults:
    a row that sets another one is bad input, never a run that silently ignores it."""
    packings: tuple[str, ...] = ("padded",)
    """How it can feed the rows (Workload.packing): a `packed` row for an engine that cannot pack is bad input,
    never a padded run under a `+packed` id."""
    checkpoints: tuple[str, ...] = ()
    """What its own checkpoint supports (see CHECKPOINTS): `resume` (Engine.save_checkpoint / load_checkpoint),
    `convert` (Engine.convert_checkpoint to HF); a `resume` / `convert` scenario for an engine without it is bad
    input."""
    checkpoint_check: str | None = None
    """'module:function() -> str | None': why its own checkpoint cannot work with what is installed (a writer that
    calls what a newer torch removed); a `resume` / `convert` scenario SKIPs with the message."""
    upstream_defects: str | None = None
    """'module:function(scenario, shape) -> str | None' (shape: the model's ModelShape, harness/config/models.py,
    None where it cannot be read): an
    upstream defect of the installed release that this row would hit (read from the packages' source, or found by
    running the package's own code on the row's data),
    naming the upstream file: the row is broken here and SKIPs as a `broken:` row does, and a test lifts it to check
    it still FAILs."""
    hf_modeling: bool = False
    """It computes with transformers' own modeling code, the reference engine's, in the recipe of the
    `hf_master_weights` baseline: on a padded, data-parallel-only CPU row its step-1 gradients then differ from that
    baseline's by reduction order alone (no bf16 routing flips either), and the step-1 baseline checks take that
    class's tight limits (harness/judge/row_class.py same_code, tolerances.py SAME_CODE_UPDATES). Set only on
    engines whose spread benchmarks/bf16_step1_spread.py shows."""
    requires: tuple[Requirement, ...] = ()
    """Packages the engine needs; a missing one SKIPs its scenarios with the reason."""
    environment_check: str | None = None
    """'module:function() -> str | None': a further torch-free check of the installed packages (e.g. a known-bad
    MindSpeed <-> megatron-core pairing); its message SKIPs the scenario and ERRORs a setup that goes ahead."""
    devices: tuple[str, ...] = DEVICES
    dtypes: tuple[str, ...] = DTYPES
    preload: tuple[str, ...] = ()
    """Modules the forkserver imports once so that each forked rank starts warm."""
    preload_excludes: tuple[str, ...] = ()
    """Top-level modules that must NOT be preloaded while this engine is planned (MindSpeed patches megatron
    before megatron is imported)."""
    cuda_apis: tuple[str, ...] = ()
    """Top-level modules of this engine that call torch.cuda by name and bind its functions at import
    (Megatron-Core's RNG tracker: `from torch.cuda import _lazy_call`). On a device whose kind names a
    `cuda_api_shim` (npu: torch_npu's transfer_to_npu, as MindSpeed's adaptor imports it) each rank imports the
    shim first, and the forkserver does not preload these modules."""
    memory: MemoryTraits = MemoryTraits()
    """How it holds a model (the memory plan)."""
    source: tuple[str, ...] = ()
    """Modules besides the engine class's own whose source decides its numbers: a cached run of this engine (a
    reference, a baseline) is reused only while all of them are unchanged (harness/judge/reference.py)."""
    reference: ReferenceRecipe | None = None
    """Set on the one engine that computes references and baselines."""
    verl: VerlNames | None = None
    """How verl's config names this engine (None: a `verl:` block never becomes it)."""

    @property
    def modules(self) -> tuple[str, ...]:
        """The engine class's module and `source`: what a cached run of it depends on."""
        return (self.engine.partition(":")[0], *self.source)

    def __post_init__(self) -> None:
        if ":" not in self.engine:
            raise ValueError(f"engine spec {self.name}: engine {self.engine!r} must be 'package.module:Class'")
        for what, given, known in (("dims", self.dims, LAYOUT_DIMS), ("kwargs_blocks", self.kwargs_blocks,
                                                                       KWARGS_BLOCKS),
                                   ("devices", self.devices, DEVICES), ("dtypes", self.dtypes, DTYPES),
                                   ("loss_agg_modes", self.loss_agg_modes, LOSS_AGG_MODES),
                                   ("packings", self.packings, PACKINGS),
                                   ("rl_step", self.rl_step, RL_STEP_FIELDS),
                                   ("checkpoints", self.checkpoints, CHECKPOINTS)):
            if unknown := set(given) - set(known):
                raise ValueError(f"engine spec {self.name}: unknown {what} {sorted(unknown)}; known: {known}")
        object.__setattr__(self, "retired", MappingProxyType(dict(self.retired)))
        object.__setattr__(self, "layout_keys", MappingProxyType(dict(self.layout_keys)))

    def missing(self) -> list[str]:
        """Every requirement not met here, in order."""
        return [problem for req in self.requires if (problem := req.problem()) is not None]

    def require(self) -> None:
        """For an engine's setup: raise when a requirement is missing (the harness skips such scenarios, so
        this only fires when the engine is driven some other way)."""
        if missing := self.missing():
            raise RuntimeError(f"engine {self.name} cannot run here: {'; '.join(missing)}")


#: a third-party engine without a spec: nothing is assumed or refused about it
def open_spec(name: str, engine: str) -> EngineSpec:
    return EngineSpec(name=name, engine=engine, summary="third-party engine (no spec)",
                      dims=frozenset(LAYOUT_DIMS), kwargs_blocks=KWARGS_BLOCKS, loss_agg_modes=LOSS_AGG_MODES,
                      packings=PACKINGS, checkpoints=CHECKPOINTS, rl_step=RL_STEP_FIELDS)
