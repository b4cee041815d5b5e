"""`mindspeed_fsdp`: the transformers model under MindSpeed's own FSDP parallel engine (`mindspeed/fsdp`).

`mindspeed.fsdp.mindspeed_parallel_engine.MindSpeedParallelEngine(config, model)` builds the meshes
('dp', 'fsdp', 'cp', 'ulysses', 'tp') and ('edp', 'efsdp', 'ep') from a `ParallelEngineConfig`, then applies
torch TP, expert parallel, recompute and FSDP2 `fully_shard` by module-name patterns. The layout maps to
it as fsdp=dp, ulysses, tp, ep; the scenario's `fsdp_kwargs` land on the config (`plan_fsdp`, pure, tested on
CPU) and `applied_kwargs()` reads every one back from the config object MindSpeed built — the check verl lacked
when `fsdp_kwargs` never reached its engine.

What MindSpeed's engine leaves to its caller, done here: the Ulysses attention exchange (engines/fsdp2/ulysses.py
over MindSpeed's 'ulysses' group) with the sum of gradients over that group it implies, and a grad norm across
DTensors on different meshes. No other gradient is reduced: the modules MindSpeed's config leaves out of FSDP
(`fsdp_plan.ignored_modules`, which its validation extends with the TP plan's modules when fsdp > 1) and the
TP-partial per-head norms (Qwen3 q_norm / k_norm) keep the gradients MindSpeed leaves them, and the numbers show
it (docs/engines.md, "What harness code may do around an engine").
Batch sharding and scoring are the fsdp2 engine's (rows over fsdp, sequence over ulysses).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from parity.engines.feeds import Feed
from parity.engines.fsdp2 import tensor_parallel, ulysses
from parity.engines.fsdp2.engine import FSDP2Engine
from parity.engines.fused_ops import COUNTER
from parity.engines.hf.common import load_hf_model
from parity.engines.mindspeed.env import find_mindspeed
from parity.engines.specs import MINDSPEED_FSDP
from parity.harness.contract.engine import DTYPE_NAMES, TORCH_DTYPES
from parity.harness.contract.schema import Scenario

#: module-name patterns (MindSpeed's `{*}` syntax) for the transformers decoder layout
LAYERS = "model.layers.{*}"
TP_COLWISE = [f"{LAYERS}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")] + \
             [f"{LAYERS}.mlp.{p}" for p in ("gate_proj", "up_proj")]
TP_ROWWISE = [f"{LAYERS}.self_attn.o_proj", f"{LAYERS}.mlp.down_proj"]
EXPERTS = f"{LAYERS}.mlp.experts"

_DTYPE_NAMES = tuple(TORCH_DTYPES)

#: fsdp_kwargs key -> (where it lives in ParallelEngineConfig, check of the value)
FSDP_KWARGS: dict[str, tuple[tuple[str, ...], Any]] = {
    "reshard_after_forward": (("fsdp_plan", "apply_modules", LAYERS, "reshard_after_forward"), bool),
    "param_dtype": (("fsdp_plan", "param_dtype"), _DTYPE_NAMES),
    "reduce_dtype": (("fsdp_plan", "reduce_dtype"), _DTYPE_NAMES),
    "output_dtype": (("fsdp_plan", "output_dtype"), _DTYPE_NAMES),
    "cast_forward_inputs": (("fsdp_plan", "cast_forward_inputs"), bool),
    "num_to_forward_prefetch": (("fsdp_plan", "num_to_forward_prefetch"), int),
    "num_to_backward_prefetch": (("fsdp_plan", "num_to_backward_prefetch"), int),
    "recompute": (("recompute",), bool),
    "recompute_plan": (("recompute_plan",), list),
    "ep_dispatcher": (("ep_plan", "dispatcher"), ("eager", "fused", "mc2")),
}


@dataclass(frozen=True, slots=True)
class FSDPEnginePlan:
    """A scenario as MindSpeed ParallelEngineConfig kwargs, in plain data."""

    config: dict[str, Any]
    """ParallelEngineConfig kwargs; fsdp_plan / tp_plan / ep_plan as dicts of their dataclass fields."""
    applied: dict[str, Any]
    """fsdp_kwargs key -> the value now in `config`."""
    dropped: tuple[str, ...]
    """fsdp_kwargs keys this engine does not know: left out of `applied`, so the harness fails the scenario."""


# ---- pure translation (runs on CPU, no mindspeed needed) --------------------------------------------------
def lookup(obj: Any, path: tuple[str, ...]) -> Any:
    """Follow `path` through dicts and attributes alike (plain plan or the real config object)."""
    for part in path:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _assign(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        tree = tree[part]
    tree[path[-1]] = value


def _check_value(key: str, value: Any, check: Any) -> None:
    if isinstance(check, tuple):
        ok = value in check
    elif check is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif check is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, check)
    if not ok:
        want = " / ".join(map(repr, check)) if isinstance(check, tuple) else {
            int: "an integer >= 0", list: "a list of module-name patterns", bool: "true or false"}[check]
        raise ValueError(f"fsdp_kwargs.{key}={value!r}: expected {want}")


def layout_sizes(scenario: Scenario) -> dict[str, int]:
    """ParallelEngineConfig parallel sizes. fsdp = dp and data_parallel_size (derived by MindSpeed) = 1. Experts:
    efsdp = dp/ep so that edp = 1 and MindSpeed's expert gradient divide factor ep*efsdp*edp equals dp."""
    lay = scenario.layout
    unsupported = [f"{name}={getattr(lay, name)}" for name in ("pp", "cp", "vpp", "etp") if getattr(lay, name) > 1]
    if unsupported or lay.sequence_parallel:
        raise ValueError(f"mindspeed_fsdp cannot take {', '.join(unsupported) or 'sequence_parallel'}: MindSpeed's "
                         "FSDP engine has no pipeline stages and builds a 'cp' mesh without any context-parallel "
                         "attention; use layout.ulysses for sequence parallelism")
    if lay.ep > 1 and (lay.tp > 1 or lay.ulysses > 1):
        raise ValueError("mindspeed_fsdp: ep > 1 is supported with dp only (tp = ulysses = 1) in this engine")
    return {"fully_shard_parallel_size": lay.dp, "tensor_parallel_size": lay.tp, "context_parallel_size": 1,
            "ulysses_parallel_size": lay.ulysses, "expert_parallel_size": lay.ep,
            "expert_fully_shard_parallel_size": lay.dp // lay.ep if lay.ep > 1 else 1,
            "expert_data_parallel_size": 1}


def plan_fsdp(scenario: Scenario) -> FSDPEnginePlan:
    """Layout + fsdp_kwargs -> ParallelEngineConfig kwargs, with the same precision defaults as the fsdp2
    engine: parameters in the scenario dtype, gradients reduced in fp32."""
    lay = scenario.layout
    config: dict[str, Any] = {
        **layout_sizes(scenario),
        "fsdp_plan": {"ignored_modules": [], "apply_modules": {LAYERS: {"reshard_after_forward": True}},
                      "param_dtype": scenario.dtype, "reduce_dtype": "fp32", "output_dtype": None,
                      "cast_forward_inputs": True, "num_to_forward_prefetch": 0, "num_to_backward_prefetch": 0},
        "tp_plan": {"colwise_parallel": TP_COLWISE if lay.tp > 1 else [],
                    "rowwise_parallel": TP_ROWWISE if lay.tp > 1 else [], "sequence_parallel": []},
        # experts fully sharded on 'efsdp' by themselves: MindSpeed's default (the parent `mlp`) would put the
        # router there too, whose gradient then misses the sum over the ep group
        "ep_plan": {"apply_modules": [EXPERTS] if lay.ep > 1 else [], "dispatcher": "eager",
                    "apply_efsdp_modules": [EXPERTS] if lay.ep > 1 else []},
        "recompute": False,
        "recompute_plan": [],
    }
    applied: dict[str, Any] = {}
    dropped = []
    for key, value in scenario.fsdp_kwargs.items():
        if key not in FSDP_KWARGS:
            dropped.append(key)
            continue
        path, check = FSDP_KWARGS[key]
        _check_value(key, value, check)
        _assign(config, path, list(value) if isinstance(value, list) else value)
        applied[key] = value
    if config["recompute"] and not config["recompute_plan"]:
        config["recompute_plan"] = [LAYERS]
    return FSDPEnginePlan(config=config, applied=applied, dropped=tuple(dropped))


# ---- the engine ---------------------------------------------------------------------------------------------
def build_config(plan: FSDPEnginePlan) -> Any:
    """The real ParallelEngineConfig (its __post_init__ validates and fills the plans)."""
    from mindspeed.fsdp.parallel_engine_config import EPPlanConfig, FSDPPlanConfig, ParallelEngineConfig, TPPlanConfig

    cfg = plan.config
    plans = {"fsdp_plan": FSDPPlanConfig(**cfg["fsdp_plan"]), "tp_plan": TPPlanConfig(**cfg["tp_plan"]),
             "ep_plan": EPPlanConfig(**cfg["ep_plan"])}
    return ParallelEngineConfig(**{**cfg, **plans})


class MindSpeedFSDPEngine(FSDP2Engine):
    """Reuses the fsdp2 engine's batch sharding and scoring; the model is wrapped by MindSpeed instead."""

    spec = MINDSPEED_FSDP

    def setup(self) -> None:
        MINDSPEED_FSDP.require()
        COUNTER.install()
        COUNTER.reset()
        self.plan = plan_fsdp(self.ctx.scenario)
        self.ms_config = build_config(self.plan)
        lay = self.ctx.scenario.layout
        if lay.ulysses > 1:
            ulysses.register()
        model = load_hf_model(self.ctx, ulysses.ATTN_NAME if lay.ulysses > 1 else "sdpa")
        kv_heads = model.config.num_key_value_heads
        if kv_heads % (lay.tp * lay.ulysses):
            raise ValueError(f"mindspeed_fsdp: tp({lay.tp}) * ulysses({lay.ulysses}) must divide the "
                             f"{kv_heads} KV heads (Ulysses splits the heads TP left on each rank)")
        if lay.ep > 1:
            _prepare_experts(model, lay.ep)
        self.model = self.wrap(model)
        self.state = self.model.parallel_state
        self.dp, self.sp, self.tp = lay.dp, lay.ulysses, lay.tp
        self.dp_rank, self.sp_rank = self.state.get_rank("fsdp"), self.state.get_rank("ulysses")
        self.tp_rank = self.state.get_rank("tp")
        if self.sp > 1:
            self.ulysses_group = self.state.get_group("ulysses")
        self.compute = _compute_context(self.plan, self.ctx.device.type)
        self.build_optimizer(self.model)
        self.model.apply_optimizer_hook(self.optimizer)

    def wrap(self, model: torch.nn.Module) -> Any:
        """MindSpeed's parallel engine around the transformers model (TP, EP, recompute, FSDP by its plan)."""
        from mindspeed.fsdp.mindspeed_parallel_engine import MindSpeedParallelEngine

        return MindSpeedParallelEngine(self.ms_config, model)

    def applied_kwargs(self) -> dict[str, Any]:
        """Read back from what MindSpeed built, never from what was asked for: the FSDP2 state of the decoder
        layers it wrapped (reshard, mixed precision, prefetch); the rest from its validated config object."""
        held = fsdp_layer_state(self.model)
        known = {key: held[key] if key in held else lookup(self.ms_config, FSDP_KWARGS[key][0])
                 for key in self.plan.applied if key in held or key not in FSDP_STATE_KEYS}
        return {"fsdp_kwargs": known} if known else {}

    def effective_dtype(self) -> str | None:
        """The param_dtype of the mixed-precision policy of EVERY module MindSpeed wrapped (none set: the dtype the
        parameters were loaded in) — the decoder layers and, under EP, the experts, whose policy MindSpeed sets
        apart from fsdp_plan (see `compute_dtype`)."""
        loaded = DTYPE_NAMES.get(next(self.model.parameters()).dtype)
        return compute_dtype({name: held or loaded for name, held in fsdp_param_dtypes(self.model).items()}, loaded)

    def run_provenance(self) -> dict[str, Any]:
        """Which MindSpeed ran, the FSDP state of its wrapped layers, the param_dtype of every module it wrapped,
        and the fused ops called on this rank."""
        source = find_mindspeed()
        return {**super().run_provenance(),
                "mindspeed": {**(source.as_dict() if source else {}), "fsdp_layers": fsdp_layer_state(self.model),
                              "fsdp_meshes": fsdp_meshes(self.model),
                              "fsdp_param_dtypes": fsdp_param_dtypes(self.model),
                              "fused_ops": COUNTER.counts(),
                              "fused_ops_source": "emulated torch_npu" if COUNTER.emulated else "torch_npu"}}

    def teardown(self) -> None:
        """MindSpeed's ParallelState is a process-wide singleton: forget it so a later engine builds its own."""
        from mindspeed.fsdp.distributed.parallel_state import ParallelState, Singleton

        Singleton._instances.pop(ParallelState, None)

    def _score_local(self, feed: Feed) -> tuple[torch.Tensor, torch.Tensor]:
        with self.compute:
            return super()._score_local(feed)

    def grad_average_ranks(self) -> int:
        """FSDP (and MindSpeed's expert FSDP, divide factor ep*efsdp = dp) average over dp."""
        return self.dp

    def after_backward(self, step: int) -> None:
        self._sum_grads_over_ulysses()

    def loss_replicas(self) -> int:
        """TP peers compute the same loss share."""
        return self.tp

    @torch.no_grad()
    def _sum_grads_over_ulysses(self) -> None:
        """The Ulysses exchange is this engine's (FSDP's mesh is 'fsdp' alone): its gradient sum over 'ulysses'."""
        if self.sp == 1:
            return
        for param in self.model.parameters():
            if param.grad is not None:
                dist.all_reduce(tensor_parallel.local(param.grad), group=self.state.get_group("ulysses"))

    def clip_grads(self, max_norm: float) -> float:
        return tensor_parallel.clip_grad_norm(self.model.parameters(), max_norm)


#: fsdp_kwargs read back from the FSDP2 state of the wrapped layers (the others from the config object)
FSDP_STATE_KEYS = ("reshard_after_forward", "param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs",
                   "num_to_forward_prefetch", "num_to_backward_prefetch")
_LAYER = re.compile(r"(^|\.)layers\.\d+$")


def fsdp_layer_state(model: torch.nn.Module) -> dict[str, Any]:
    """The FSDP2 settings the decoder layers actually hold (torch's FSDPState of each `fully_shard`-ed layer):
    resharding after forward, the mixed-precision policy, and how many layers each prefetches (the most any
    layer does: the last ones have fewer left to prefetch). Empty when no layer was wrapped."""
    from torch.distributed.fsdp import FSDPModule

    layers = [m for name, m in model.named_modules() if _LAYER.search(name) and isinstance(m, FSDPModule)]
    if not layers:
        return {}
    states = [layer._get_fsdp_state() for layer in layers]
    reshard = {s._fsdp_param_group.post_forward_mesh_info is not None for s in states if s._fsdp_param_group}
    policy = states[0]._mp_policy

    def name(dtype: torch.dtype | None) -> str | None:
        return None if dtype is None else DTYPE_NAMES.get(dtype, str(dtype))

    return {"reshard_after_forward": reshard.pop() if len(reshard) == 1 else sorted(reshard),
            "param_dtype": name(policy.param_dtype), "reduce_dtype": name(policy.reduce_dtype),
            "output_dtype": name(policy.output_dtype), "cast_forward_inputs": policy.cast_forward_inputs,
            "num_to_forward_prefetch": max(len(s._states_to_forward_prefetch) for s in states),
            "num_to_backward_prefetch": max(len(s._states_to_backward_prefetch) for s in states)}


def fsdp_param_dtypes(model: torch.nn.Module) -> dict[str, str | None]:
    """Module name -> the param_dtype of the mixed-precision policy `fully_shard` gave it (None: casts nothing),
    for every module MindSpeed wrapped: decoder layers on 'fsdp', experts on 'efsdp'."""
    from torch.distributed.fsdp import FSDPModule

    held = {name: m._get_fsdp_state()._mp_policy.param_dtype for name, m in model.named_modules()
            if isinstance(m, FSDPModule)}
    return {name: None if dtype is None else DTYPE_NAMES.get(dtype, str(dtype)) for name, dtype in held.items()}


def compute_dtype(by_module: dict[str, str | None], default: str | None) -> str | None:
    """The one dtype every wrapped module computes in, else which modules compute in which — never the scenario's
    dtype, so the verdict FAILs it. Needed because MindSpeed's expert FSDP hard-codes its own policy:
    mindspeed/fsdp/distributed/expert_parallel/expert_fully_shard_parallel.py (master 028de58c, line 17)
    `MixedPrecisionPolicy(param_dtype=torch.bfloat16, ...)`, whatever fsdp_plan.param_dtype says, so an fp32 run
    computes its experts in bf16 (tiny-mixtral ep2: log-probs 5.9e-3 off)."""
    groups: dict[str | None, list[str]] = {}
    for name, dtype in by_module.items():
        groups.setdefault(dtype, []).append(name)
    if len(groups) <= 1:
        return next(iter(groups), default)

    def group(dtype: str | None, names: list[str]) -> str:
        shown = ", ".join(names[:2]) + (", ..." if len(names) > 2 else "")
        return f"{dtype} in {len(names)} FSDP module{'s' if len(names) > 1 else ''} ({shown})"

    return "; ".join(group(d, n) for d, n in sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))))


def _compute_context(plan: FSDPEnginePlan, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The caller's recipe, as verl's FSDP engine runs every forward: under autocast at the mixed-precision
    param_dtype whenever it is not fp32 (verl/workers/engine/fsdp/transformer_impl.py `forward_step`), whatever the
    layout. (Applied only where MindSpeed keeps TP modules out of FSDP — fsdp > 1 with tp > 1, whose fp32 weights
    otherwise meet bf16 activations — it was a repair shaped around one MindSpeed behaviour.)"""
    dtype = TORCH_DTYPES[plan.config["fsdp_plan"]["param_dtype"]]
    return contextlib.nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype=dtype)


def fsdp_meshes(model: torch.nn.Module) -> dict[str, str]:
    """Each module MindSpeed `fully_shard`-ed -> the mesh its parameters live on, 'name(size)' per dimension (the
    decoder layers and the root on 'fsdp', experts on 'efsdp'): read back from the FSDP state, never from the
    plan."""
    from torch.distributed.fsdp import FSDPModule

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule) and (group := module._get_fsdp_state()._fsdp_param_group) is not None:
            mesh = group.mesh_info.mesh
            out[name or "<root>"] = " x ".join(f"{dim}({mesh.size(i)})"
                                                for i, dim in enumerate(mesh.mesh_dim_names or ("?",)))
    return out


def _prepare_experts(model: torch.nn.Module, ep: int) -> None:
    """Fit transformers' fused experts to MindSpeed's EP dispatcher: it reads `experts.hidden_size` (transformers
    5 names it `hidden_dim`) and builds `expert_ids_per_ep_rank` only for more than one local expert."""
    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue
        if not hasattr(experts, "hidden_size"):
            experts.hidden_size = experts.hidden_dim
        if experts.num_experts // ep < 2:
            raise ValueError(f"mindspeed_fsdp: ep({ep}) leaves {experts.num_experts // ep} expert per rank; "
                             "MindSpeed's EP dispatcher needs at least 2 local experts")
