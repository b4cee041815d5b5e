"""verl's vocabulary, one front door: a scenario's engine settings in the names verl users already have in their
YAML. Both spellings parse here: the `verl:` block (`translate`, for the harness's own engines, through the rules
of engines/verl/blocks.py) and verl's own `actor_rollout_ref` tree (`prepare_tree`, for verl's own engines, through
the key tables of engines/verl/keys.py). A key that restates a scenario field is stated once, in keys.py; what an
engine supports (packings, schedules, loss aggregations, RL-step settings) is read from its EngineSpec by
validation, never refused here.

A scenario may carry a `verl:` block instead of `strategy` + `layout`, in either of two forms:
- verl's trainer config, nested and/or dotted: `actor_rollout_ref.actor.{strategy, megatron, fsdp_config, optim}`
  and `trainer.{n_gpus_per_node, nnodes, device}` — whole blocks as verl generates them; every key translates or
  is refused with its reason (engines/verl/blocks.py);
- the flat engine-config form: McoreEngineConfig / FSDPEngineConfig field names at the top of the block (read
  through the same rules) plus `strategy`, `device`, `n_gpus_per_node`, `nnodes`, `mcore_kwargs`, `fsdp_kwargs`.
The same constraints verl enforces apply: sequence parallel is forced off at TP=1, `fsdp_size: -1` means the whole
data-parallel world, `expert_tensor_parallel_size: null` means etp = tp, and a key left out takes verl's default.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parity.engines.specs import RETIRED, canonical
from parity.engines.verl.blocks import (
    ACTOR,
    BLOCK_FAMILY,
    BLOCKS,
    DEFAULT_STRATEGY,
    ENGINE_KWARGS,
    FAMILY_BLOCK,
    FAMILY_DEFAULTS,
    FLAT_EXTRAS,
    IMPLIED,
    KWARGS_FAMILY,
    RULES,
    TRAINER,
    TRAINER_KEYS,
    VERL_ENGINES,
    Inert,
    Merge,
    Only,
    RefusedKey,
    To,
    resolve_interpolation,
    rule_for,
)
from parity.engines.verl.keys import BLOCK, DTYPE_NAMES, PACKING, SECTIONS, VERL_DTYPE, EngineKeys, same_value
from parity.harness.contract.config_tree import did_you_mean, flatten
from parity.harness.contract.renames import RENAMED_KEYS

#: a harness strategy -> the engine verl's same strategy runs on device npu (verl PR #7374: MindSpeed's path)
NPU_STRATEGIES = {name: verl.on_npu for name, verl in VERL_ENGINES.items() if verl.on_npu}
#: engine families: which of verl's engine families (and so engine blocks) a harness strategy reads
FAMILIES = {name: verl.family for name, verl in VERL_ENGINES.items()}
#: names from before verl PR #6316: retired strategies and renamed kwargs blocks
OLD_NAMES = (*RETIRED, *RENAMED_KEYS)
TREES = ("actor_rollout_ref", "trainer")
#: the one rollout key a training scenario takes: GRPO's group size (the actor reads it as actor.rollout_n)
ROLLOUT_N = "rollout.n"
#: every flat-form key (for did-you-mean)
FLAT_KEYS = (*FLAT_EXTRAS, *ENGINE_KWARGS, *(k for table in RULES.values() for k in table if "." not in k))
#: what the actor's other keys are, for their refusal
_ACTOR_ELSEWHERE = ("a verl actor setting outside its engine blocks (loss, batching, checkpoint, profiler): "
                    "the `verl:` block configures the harness's engine from actor.strategy / megatron / fsdp_config "
                    "/ optim; the scenario's workload sets the loss and batch (workload.clip_ratio, entropy_coeff, "
                    "loss_agg_mode, ...). To run verl's own actor, use strategy verl_fsdp with this tree as "
                    "actor_rollout_ref")
_NOT_THE_ENGINE = ("not the actor's training engine: the harness runs one engine, configured from "
                   "actor_rollout_ref.actor; the model comes from the scenario's `model`")
_TRAINER_ELSEWHERE = "only trainer.n_gpus_per_node, trainer.nnodes and trainer.device describe the engine's world"


@dataclass(slots=True)
class _Translation:
    fields: dict[str, Any] = field(default_factory=dict)
    """scenario field ('layout.tp', 'mcore_kwargs.x', 'workload.lr', 'dtype', ...) -> value."""
    merged: dict[str, dict[str, Any]] = field(default_factory=lambda: {b: {} for b in ENGINE_KWARGS})
    problems: list[tuple[str, str]] = field(default_factory=list)


def translate(raw: dict[str, Any], where: dict[str, str]) -> dict[str, Any]:
    """A raw scenario mapping with a `verl:` block -> the same mapping in harness fields; raises RefusedKey
    naming the key as the user wrote it (`where` names the file and scenario in warnings)."""
    block = raw.get("verl")
    if block is None:
        return raw
    if not isinstance(block, dict):
        raise RefusedKey("verl", "'verl' must be a mapping of verl engine config fields")
    for clash in ("strategy", "layout", "engine"):
        if clash in raw:
            raise RefusedKey(clash, f"give the engine either as 'verl' or as '{clash}', not both")
    trees = {k: v for k, v in block.items() if isinstance(k, str) and k.split(".")[0] in TREES}
    tree_leaves, problems = flatten(trees, root="verl")
    _raise_first(problems, where)
    strategy = _strategy(block, tree_leaves)
    family = FAMILIES.get(canonical(strategy))
    canonical_block, shown = dict(trees), {}
    for key, value in block.items():
        if key in trees:
            continue
        path = _flat_path(key, family, where)
        canonical_block[path] = value
        shown[path] = key
    leaves, problems = flatten(canonical_block, root="verl")
    _raise_first(problems, where)
    result = _Translation()
    for key, value in leaves.items():
        _apply(key, value, leaves, family, _shown(key, shown), result)
    _raise_first(result.problems, where)
    return _assemble(raw, block, strategy, family, result, where)


def _strategy(block: dict[str, Any], tree: dict[str, Any]) -> str:
    """The block's strategy: given (flat or actor.strategy), else the family of the engine block it carries."""
    in_blocks = [tree[key] for key in (f"{ACTOR}{b}.strategy" for b in FAMILY_BLOCK.values()) if key in tree]
    given = block.get("strategy", tree.get(ACTOR + "strategy", in_blocks[0] if in_blocks else None))
    if given is not None:
        return str(given)
    carried = (BLOCK_FAMILY.get(key[len(ACTOR):].split(".")[0]) for key in tree if key.startswith(ACTOR))
    family = next((family for family in carried if family in IMPLIED), None)
    return IMPLIED[family] if family else DEFAULT_STRATEGY


def _flat_path(key: Any, family: str | None, where: dict[str, str]) -> str:
    """A flat-form key -> its place in verl's trainer tree (engine keys in the strategy's block)."""
    if key in FLAT_EXTRAS:
        return FLAT_EXTRAS[key]
    if key in ENGINE_KWARGS:
        return f"harness.{key}"
    blocks = sorted(FAMILY_BLOCK.values(), key=lambda block: block != FAMILY_BLOCK.get(family or ""))
    for block in blocks:  # the strategy's own block first; a key of another is refused below, naming both
        if rule_for(BLOCKS[block], str(key)) is not None:
            return f"{ACTOR}{block}.{key}"
    raise RefusedKey(f"verl.{key}", f"unknown verl engine field{did_you_mean(key, FLAT_KEYS)}")


def _shown(key: str, shown: dict[str, str]) -> str:
    """The key as the user wrote it (flat-form keys by their flat name)."""
    for path, flat in shown.items():
        if key == path or key.startswith(path + "."):
            return f"verl.{flat}{key[len(path):]}"
    return f"verl.{key}"


def _apply(key: str, value: Any, leaves: dict[str, Any], family: str | None, shown: str,
           result: _Translation) -> None:
    if key == "_target_" or key.endswith("._target_"):
        return  # verl's config class: the harness builds its own
    if key.startswith("harness."):
        name = key.split(".", 1)[1]
        block, _, sub = name.partition(".")
        if sub:
            _nest(result.merged[block], sub, value)
        elif not isinstance(value, Mapping):
            result.problems.append((shown, f"'{block}' must be a mapping of engine settings"))
        return
    found, why_not = _rule(key, family)
    if found is None:
        result.problems.append((shown, why_not))
        return
    pattern, rule = found
    if isinstance(rule, Inert):
        return
    value, resolved = resolve_interpolation(value, leaves)
    if not resolved:
        result.problems.append((shown, f"{value!r} is an OmegaConf interpolation the harness does not resolve: give "
                                       "the value"))
        return
    if isinstance(rule, Only):
        if not any(same_value(value, allowed) for allowed in rule.values):
            taken = " or ".join(repr(v) for v in rule.values)
            result.problems.append((shown, f"{value!r} is refused: {rule.why} (taken: {taken})"))
        return
    if isinstance(rule, Merge):
        _merge(key, value, pattern, rule, family, shown, result)
        return
    _to(value, rule, family, shown, result)


def _rule(key: str, family: str | None) -> tuple[tuple[str, To | Merge | Only | Inert] | None, str]:
    """The rule for a dotted key of verl's trainer tree, or why there is none."""
    if key.startswith(ACTOR):
        rel = key[len(ACTOR):]
        if rel == "strategy":
            return ("strategy", To("strategy")), ""
        head, _, inner = rel.partition(".")
        if head not in BLOCKS:
            return None, _ACTOR_ELSEWHERE
        owner = BLOCK_FAMILY.get(head)
        if owner is not None and family is not None and owner != family:
            return None, (f"the '{head}' block is read by verl's {owner} engines only; this block's strategy runs "
                          f"the {family} family")
        found = rule_for(BLOCKS[head], inner)
        if found is None:
            known = [k for k in BLOCKS[head] if not k.endswith(".*")]
            return None, f"unknown key of verl's actor.{head} block{did_you_mean(inner, known)}"
        return found, ""
    if key.startswith("actor_rollout_ref."):
        return None, _NOT_THE_ENGINE
    name = key[len(TRAINER):] if key.startswith(TRAINER) else ""
    return ((name, TRAINER_KEYS[name]) if name in TRAINER_KEYS else None), _TRAINER_ELSEWHERE


def _merge(key: str, value: Any, pattern: str, rule: Merge, family: str | None, shown: str,
           result: _Translation) -> None:
    inner = key[len(ACTOR):].partition(".")[2]  # the key within its block
    sub = inner[len(pattern):].lstrip(".")
    if not sub:
        if value is not None and not isinstance(value, Mapping):  # None: verl's FSDP default for the override
            result.problems.append((shown, f"'{pattern}' must be a mapping of TransformerConfig / DDP / optimizer / "
                                           "MindSpeed settings"))
        return
    if KWARGS_FAMILY.get(rule.block, family) != family:
        result.problems.append((shown, f"{value!r} is refused: a Megatron setting, and this block's strategy runs "
                                       f"the {family} family"))
        return
    _nest(result.merged[rule.block], sub, value)


def _to(value: Any, rule: To, family: str | None, shown: str, result: _Translation) -> None:
    target_block = rule.field.split(".", 1)[0]
    wanted = KWARGS_FAMILY.get(target_block)
    if wanted is not None and family != wanted:
        result.problems.append((shown, f"{value!r} is refused: a {wanted} engine setting, and this block's "
                                       f"strategy runs the {family} family"))
        return
    try:
        converted = rule.convert(value) if rule.convert is not None and value is not None else value
    except ValueError as exc:
        result.problems.append((shown, str(exc)))
        return
    if rule.field in result.fields and not same_value(result.fields[rule.field], converted):
        result.problems.append((shown, f"{value!r} disagrees with another verl key that sets {rule.field} "
                                       f"({result.fields[rule.field]!r}): give it once"))
        return
    result.fields[rule.field] = converted


def _nest(target: dict[str, Any], dotted: str, value: Any) -> None:
    head, _, rest = dotted.partition(".")
    if not rest:
        target[head] = value
        return
    inner = target.setdefault(head, {})
    if isinstance(inner, dict):
        _nest(inner, rest, value)


def _raise_first(problems: list[tuple[str, str]], where: dict[str, str]) -> None:
    if not problems:
        return
    key, message = problems[0]
    if len(problems) > 1:
        message += f" (also: {'; '.join(f'{k}: {m}' for k, m in problems[1:])})"
    raise RefusedKey(key, message)


def _assemble(raw: dict[str, Any], block: dict[str, Any], strategy: str, family: str | None, result: _Translation,
              where: dict[str, str]) -> dict[str, Any]:
    """The translated fields (with verl's defaults for what the block leaves out) -> harness scenario fields."""
    fields = dict(result.fields)
    given = set(fields)
    defaults, rules = FAMILY_DEFAULTS.get(family or "", ({}, {}))
    for name, default in defaults.items():
        rule = rules[name]
        assert isinstance(rule, To)
        fields.setdefault(rule.field, rule.convert(default) if rule.convert and default is not None else default)
    out = {k: v for k, v in raw.items() if k != "verl"}
    device = fields.get("device", raw.get("device", "cpu"))
    out["device"] = device
    name = canonical(str(fields.get("strategy", strategy)))
    out["strategy"] = NPU_STRATEGIES.get(name, name) if device == "npu" else name
    out["layout"] = _layout(fields, given, where)
    for kwargs_block in ENGINE_KWARGS:
        from_fields = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith(kwargs_block + ".")}
        combined = {**raw.get(kwargs_block, {}), **from_fields, **result.merged[kwargs_block]}
        if combined:
            out[kwargs_block] = combined
    if "dtype" in given or "dtype" not in raw:
        out["dtype"] = fields.get("dtype", raw.get("dtype"))
        if out["dtype"] is None:
            del out["dtype"]
    workload = dict(raw.get("workload") or {})
    for key, value in fields.items():
        if not key.startswith("workload."):
            continue
        name = key.split(".", 1)[1]
        if name in workload and not same_value(workload[name], value):
            raise RefusedKey(f"workload.{name}", f"verl sets {value!r}, the scenario's workload "
                                                 f"{workload[name]!r}: give it once")
        workload[name] = value
    if workload:
        out["workload"] = workload
    return out


def _layout(fields: dict[str, Any], given: set[str], where: dict[str, str]) -> dict[str, Any]:
    layout = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("layout.")}
    if layout.get("vpp", 1) is None:
        del layout["vpp"]
    if "etp" in layout and layout["etp"] is None:  # Megatron's rule: no expert TP size = the dense TP size
        del layout["etp"]
        if layout.get("ep", 1) > 1:
            layout["etp"] = layout.get("tp", 1)
    if layout.get("sequence_parallel") and not verl_sequence_parallel(layout.get("tp", 1), True):
        if "layout.sequence_parallel" in given:
            print(f"parity: warning: {where['file']}, scenario {where['scenario']}: sequence_parallel forced off "
                  "because tensor_model_parallel_size is 1 (as verl does)", file=sys.stderr)
        layout["sequence_parallel"] = False
    nodes = int(fields.get("nnodes", 1))
    per_node = fields.get("n_gpus_per_node")
    if per_node is not None:
        layout |= {"nodes": nodes, "nproc_per_node": int(per_node)}
    layout["dp"] = _data_parallel(fields.get("fsdp_size", -1), layout, nodes * int(per_node) if per_node else None,
                                  where)
    return layout


def verl_sequence_parallel(tp: int, sequence_parallel: bool) -> bool:
    """Megatron's sequence parallelism as verl takes it: off at TP 1 whatever is given (verl/workers/config/
    engine.py McoreEngineConfig.__post_init__; its generated default is true)."""
    return bool(sequence_parallel) and int(tp) > 1


def _data_parallel(fsdp_size: Any, layout: dict[str, Any], world: int | None, where: dict[str, str]) -> int:
    """dp from fsdp_size (-1 = everything left) or, for Megatron layouts, world / (tp * pp * cp)."""
    model_parallel = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1) * layout.get("ulysses", 1)
    if fsdp_size not in (-1, None):
        return int(fsdp_size)
    if world is None:
        return 1
    if world % model_parallel:
        raise RefusedKey("verl", f"n_gpus_per_node * nnodes = {world} is not divisible by the model-parallel size "
                                 f"{model_parallel}")
    return world // model_parallel


def vocabulary(block: dict[str, Any], device: str | None = None) -> str:
    """Which verl version's names a `verl:` block uses (see the module docstring)."""
    tree, _ = flatten({k: v for k, v in block.items() if isinstance(k, str) and k.split(".")[0] in TREES})
    strategy = str(block.get("strategy", tree.get(ACTOR + "strategy", "")))
    device = block.get("device", tree.get(TRAINER + "device", device))
    if any(name in OLD_NAMES for name in (strategy, *block)):
        return "verl before PR #6316 (mindspeed_llm / mindspeed_mm, llm_kwargs / mm_kwargs): run parity migrate"
    if strategy.startswith("mindspeed_"):
        return "verl PR #6316 .. #7374 (mindspeed_megatron / mindspeed_fsdp strategies)"
    overrides = "override_transformer_config" in block or any(".override_transformer_config." in k for k in tree)
    if overrides or (canonical(strategy) in NPU_STRATEGIES and device == "npu"):
        return "verl since PR #7374 (strategy megatron + override_transformer_config; MindSpeed on device npu)"
    if tree:
        return "verl trainer config (actor_rollout_ref.actor engine blocks; the same in every version)"
    return "verl engine config (the same in every version)"


# ---- verl's own engines: the actor_rollout_ref tree ---------------------------------------------------------
def _get(raw: Mapping[str, Any], path: str) -> Any:
    node: Any = raw
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _set(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    if not rest:
        return {**raw, head: value}
    inner = raw.get(head)
    return {**raw, head: _set(dict(inner) if isinstance(inner, Mapping) else {}, rest, value)}


def _field_default(path: str) -> Any:
    from parity.harness.contract.schema import Layout, Scenario, Workload

    head, _, rest = path.partition(".")
    if head == "workload":
        return Workload.model_fields[rest].default
    if head == "layout":
        return Layout.model_fields[rest].default
    return Scenario.model_fields[head].default


def _field_problem(path: str, value: Any) -> str | None:
    """Why the scenario field cannot take a value derived from a verl key (its schema type)."""
    from pydantic import TypeAdapter, ValidationError

    from parity.harness.contract.schema import Layout, Scenario, Workload

    head, _, rest = path.partition(".")
    model, name = {"workload": (Workload, rest), "layout": (Layout, rest)}.get(head, (Scenario, head))
    try:
        TypeAdapter(model.model_fields[name].annotation).validate_python(value)
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    return None


def _to_scenario(field: str, value: Any) -> Any:
    if field == "dtype":
        return DTYPE_NAMES.get(str(value), value)
    if field == "workload.packing" and isinstance(value, bool):
        return PACKING[value]
    return value


def _to_verl(field: str, value: Any) -> Any:
    if field == "dtype":
        return VERL_DTYPE.get(value, value)
    if field == "workload.packing":
        return {v: k for k, v in PACKING.items()}.get(value, value)
    return value


def _same(field: str, verl_value: Any, scenario_value: Any) -> bool:
    converted = _to_scenario(field, verl_value)
    if isinstance(converted, (int, float)) and not isinstance(converted, bool):
        return isinstance(scenario_value, (int, float)) and float(converted) == float(scenario_value)
    return converted == scenario_value


def prepare_tree(raw: dict[str, Any], keys: EngineKeys) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A scenario of one of verl's own engines: its `actor_rollout_ref` tree flattened, and the keys that restate a
    scenario field reconciled with it (engines/verl/keys.py's module docstring)."""
    flat, problems = flatten(raw.get(BLOCK) or {})
    if ROLLOUT_N in flat:  # where verl users set the group: verl's actor.rollout_n interpolates it
        n = flat.pop(ROLLOUT_N)
        if not same_value(flat.setdefault("actor.rollout_n", n), n):
            problems.append((f"{BLOCK}.{ROLLOUT_N}", f"{n!r} disagrees with actor.rollout_n "
                                                     f"{flat['actor.rollout_n']!r}, which verl's config sets from it "
                                                     "(${oc.select:actor_rollout_ref.rollout.n,1}): give it once"))
    for key in flat:
        if key.split(".", 1)[0] not in SECTIONS:
            problems.append((f"{BLOCK}.{key}", f"the verl engines read actor_rollout_ref's "
                                               f"{', '.join(SECTIONS[:-1])} and {SECTIONS[-1]} sections only "
                                               f"(and {ROLLOUT_N}, the group size)"))
    if problems:
        return raw, problems
    # `${oc.select:path,default}` references of a copy of verl's generated config, resolved as in a `verl:` block
    given = {f"{BLOCK}.{key}": value for key, value in flat.items()}
    flat = {key: resolved if done else value for key, value in flat.items()
            for resolved, done in [resolve_interpolation(value, given)]}
    out = dict(raw)
    # the keys given in the verl tree first, so that a field one of them sets is written into the others
    for key, target in keys.shared.items():
        if (given_verl := flat.get(key)) is None:
            continue
        if (given_scenario := _get(out, target)) is None:
            derived = _to_scenario(target, given_verl)
            if (problem := _field_problem(target, derived)) is not None:
                problems.append((f"{BLOCK}.{key}", f"{given_verl!r} cannot be the scenario's {target}: {problem}"))
                continue
            out = _set(out, target, derived)
        elif not _same(target, given_verl, given_scenario):
            problems.append((f"{BLOCK}.{key}", f"{given_verl!r} disagrees with the scenario's {target} "
                                               f"{given_scenario!r}: give it once"))
    for key, target in keys.shared.items():
        if key not in flat:
            value = _get(out, target)
            if key in keys.quiet_defaults and (value is None or value == _field_default(target)):
                continue
            flat[key] = _to_verl(target, _field_default(target) if value is None else value)
            if key in keys.verl_none and flat[key] == keys.verl_none[key]:
                flat[key] = None
    out[BLOCK] = flat
    out, more = rl_step_keys(out)
    return out, problems + more


def _problem(key: str, message: str) -> tuple[str, str]:
    return (f"{BLOCK}.{key}", message)


def rl_step_keys(out: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The verl keys of the RL step that restate a workload field through arithmetic (see RL_SHARED's note): given
    in the verl tree they set the field, given in both they must agree, given in neither verl's tree gets the
    workload's value."""
    flat, workload, problems = dict(out[BLOCK]), dict(out.get("workload") or {}), []
    default = _field_default
    # rollout_n: the workload's group_size (verl's 1: no group)
    n_given = flat.get("actor.rollout_n")
    group = workload.get("group_size")
    if n_given is not None:
        as_group = None if int(n_given) == 1 else int(n_given)
        if "group_size" not in workload:
            if as_group is not None:
                workload["group_size"] = as_group
        elif as_group != group:
            problems.append(_problem("actor.rollout_n", f"{n_given!r} disagrees with the scenario's "
                                                        f"workload.group_size {group!r}: give it once"))
    n = int(workload.get("group_size") or 1)
    # clip ratios: verl's clip_ratio_low / high (default 0.2 each) are the workload's clip_low / clip_high
    clip = float(workload.get("clip_ratio", default("workload.clip_ratio")))
    for side in ("low", "high"):
        key, name = f"actor.clip_ratio_{side}", f"clip_ratio_{side}"
        given = flat.get(key)
        if given is None:
            flat[key] = float(workload[name]) if workload.get(name) is not None else clip
        elif workload.get(name) is None:
            if float(given) != clip:
                workload[name] = float(given)
        elif float(given) != float(workload[name]):
            problems.append(_problem(key, f"{given!r} disagrees with the scenario's workload.{name} "
                                          f"{workload[name]!r}: give it once"))
    # ppo_mini_batch_size: prompts per mini-batch; the workload's mini_batches = batch_size / (it x rollout_n)
    batch = int(workload.get("batch_size", default("workload.batch_size")))
    given = flat.get("actor.ppo_mini_batch_size")
    if given is None:
        flat["actor.ppo_mini_batch_size"] = batch // int(workload.get("mini_batches", 1)) // n
    else:
        sequences = int(given) * n
        if batch % sequences:
            problems.append(_problem("actor.ppo_mini_batch_size", f"{given!r} prompts x rollout_n {n} do not split "
                                                                  f"the scenario's batch_size {batch} into whole "
                                                                  "mini-batches"))
        elif "mini_batches" not in workload:
            if batch // sequences != 1:
                workload["mini_batches"] = batch // sequences
        elif int(workload["mini_batches"]) != batch // sequences:
            problems.append(_problem("actor.ppo_mini_batch_size", f"{given!r} prompts x rollout_n {n} make "
                                                                  f"{batch // sequences} mini-batches of the batch "
                                                                  f"({batch}); the scenario's workload.mini_batches "
                                                                  f"is {workload['mini_batches']!r}: give it once"))
    problems += _mini_batch_shards(workload, out)
    return {**out, BLOCK: flat, **({"workload": workload} if workload else {})}, problems


def _mini_batch_shards(workload: dict[str, Any], out: dict[str, Any]) -> list[tuple[str, str]]:
    """verl's single controller hands each data-parallel rank one consecutive chunk of the batch and each rank cuts
    its own into mini-batches (TrainingWorker.train_mini_batch): the workload's mini-batches are drawn from dp
    shards. Written into the workload where there are several mini-batches; given, it must be the dp size."""
    dp = int((out.get("layout") or {}).get("dp", 1))
    if int(workload.get("mini_batches", 1)) == 1 or dp == 1:
        return []
    given = workload.setdefault("mini_batch_shards", dp)
    if int(given) != dp:
        return [("workload.mini_batch_shards", f"{given!r}: verl draws each mini-batch from its {dp} data-parallel "
                                               "ranks' consecutive chunks of the batch (layout.dp)")]
    return []
