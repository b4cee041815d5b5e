"""verl's engine blocks taken whole (engines/verl/vocabulary.py, the rules of engines/verl/blocks.py and
engines/verl/keys.py): every key of the blocks verl generates has a rule (tests/data/verl/generated_blocks.yaml, and
the installed verl's own generated configs in the verl lane), the blocks as generated parse through both spellings
(a `verl:` block for the harness's engines, `actor_rollout_ref` for verl's own) with no refusal for any engine that
runs them, no refusal contradicts an EngineSpec, nested and dotted trees are the same, verl's defaults and Megatron's
etp rule apply, and each kind of refusal names the key and why."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from parity.engines.specs import BUILTIN, SPECS
from parity.engines.verl import keys as verl_keys
from parity.engines.verl.blocks import ACTOR, BLOCKS, Only, To
from parity.engines.verl.rules import _has_megatron_bridge
from parity.engines.verl.vocabulary import FAMILIES, _rule
from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from parity.harness.config.matrix import translate_verl as translate
from parity.harness.config.validate import layout_errors
from parity.harness.contract.config_tree import flatten
from parity.harness.contract.schema import RL_STEP_FIELDS, SCHEDULE_FIELDS, Workload
from tests.conftest import DATA

pytestmark = pytest.mark.torch_free

GENERATED = yaml.safe_load((DATA / "verl" / "generated_blocks.yaml").read_text())
WHERE = {"file": "f.yaml", "scenario": "s"}


def _unknown(tree: dict[str, Any], family: str) -> list[tuple[str, str]]:
    leaves, problems = flatten(tree)
    assert not problems
    return [(key, why) for key in leaves if key.startswith(ACTOR) and not key.endswith("_target_")
            for found, why in [_rule(key, family)] if found is None]


@pytest.mark.parametrize("family", ["megatron", "fsdp"])
def test_every_key_verl_generates_has_a_rule(family):
    assert _unknown({"actor_rollout_ref": GENERATED[family]["actor_rollout_ref"]}, family) == []


def _installed_verl_config(name: str) -> dict[str, Any]:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl lane only: verl is not installed (pip install -e '.[verl]' -c ci/constraints-verl.txt)")
    path = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config" / name
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(("family", "name", "blocks"), [
    ("megatron", "_generated_ppo_megatron_trainer.yaml", ("megatron", "optim")),
    ("fsdp", "_generated_ppo_trainer.yaml", ("fsdp_config", "optim"))])
def test_the_installed_verls_generated_blocks_have_rules(family, name, blocks):
    actor = _installed_verl_config(name)["actor_rollout_ref"]["actor"]
    assert _unknown({"actor_rollout_ref": {"actor": {b: actor[b] for b in blocks}}}, family) == []


def _scenario(verl: dict[str, Any], **raw: Any) -> dict[str, Any]:
    return translate({"model": "tiny-qwen3-moe", **raw, "verl": verl}, WHERE)


def test_the_generated_megatron_block_translates():
    out = _scenario(GENERATED["megatron"], device="npu")
    assert out["strategy"] == "mindspeed_megatron" and out["dtype"] == "bf16"  # verl's megatron on npu, its dtype
    # verl's default degrees; sequence_parallel (verl's default true) forced off at tp 1
    assert out["layout"] == {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "sequence_parallel": False, "dp": 1}
    assert out["mcore_kwargs"] == {"use_distributed_optimizer": True, "recompute_granularity": None,
                                   "recompute_modules": ["core_attn"], "recompute_method": None,
                                   "recompute_num_layers": None, "attention_backend": "flash",
                                   # the optim block's Megatron OptimizerConfig fields, dtypes as torch names
                                   "use_precision_aware_optimizer": False, "main_grads_dtype": "float32",
                                   "exp_avg_dtype": "float32", "exp_avg_sq_dtype": "float32"}
    # verl's default use_remove_padding: true is packed rows; its schedule keys are the workload's (constant lr)
    assert out["workload"] == {"seed": 42, "lr": 1e-6, "weight_decay": 0.01, "grad_clip": 1.0, "optimizer": "adamw",
                               "packing": "packed", "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0,
                               "lr_scheduler_type": "constant"}


def test_the_generated_fsdp_block_translates():
    out = _scenario(GENERATED["fsdp"], device="npu")
    assert out["strategy"] == "fsdp2" and out["dtype"] == "bf16" and out["layout"] == {"ulysses": 1, "dp": 1}
    assert out["fsdp_kwargs"] == {"reshard_after_forward": True}
    assert out["workload"] == {"seed": 42, "lr": 1e-6, "weight_decay": 0.01, "grad_clip": 1.0, "optimizer": "adamw",
                               "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant",
                               "min_lr_ratio": 0.0}


def test_nested_dotted_and_flat_forms_are_one_scenario(write_yaml):
    path = write_yaml("""
        defaults: {model: tiny-qwen3-moe, device: cpu}
        matrix:
          - verl:
              actor_rollout_ref: {actor: {strategy: megatron, megatron: {tensor_model_parallel_size: 2,
                                  expert_model_parallel_size: 2}}}
              trainer: {n_gpus_per_node: 4}
            name: nested
          - verl:
              actor_rollout_ref.actor.strategy: megatron
              actor_rollout_ref.actor.megatron.tensor_model_parallel_size: 2
              actor_rollout_ref.actor.megatron.expert_model_parallel_size: 2
              trainer.n_gpus_per_node: 4
            name: dotted
          - verl: {strategy: megatron, tensor_model_parallel_size: 2, expert_model_parallel_size: 2, n_gpus_per_node: 4}
            name: flat
    """)
    nested, dotted, flat = load_file(path)
    for scenario in (nested, dotted, flat):
        assert scenario.strategy == "megatron" and scenario.dtype == "bf16"
        # verl's defaults: SP on (tp 2), etp null = tp, distributed optimizer on
        assert scenario.layout.tag() == "dp2-tp2-ep2-etp2-sp"
        assert scenario.mcore_kwargs == {"use_distributed_optimizer": True}


@pytest.mark.parametrize(("etp", "expected"), [(None, 2), (1, 1), (2, 2)])
def test_expert_tensor_parallel_null_is_the_tensor_parallel_size(etp, expected):
    out = _scenario({"strategy": "megatron", "tensor_model_parallel_size": 2, "expert_model_parallel_size": 2,
                     "expert_tensor_parallel_size": etp, "n_gpus_per_node": 4})
    assert out["layout"]["etp"] == expected


def test_verls_current_30b_nightly_layout():
    """verl's tests/special_npu/nightly_ci_ascend/run_gspo_qwen3_30b_megatron_npu.sh, its actor engine keys."""
    actor = "actor_rollout_ref.actor."
    out = _scenario({f"{actor}strategy": "megatron", f"{actor}megatron.tensor_model_parallel_size": 2,
                     f"{actor}megatron.pipeline_model_parallel_size": 1,
                     f"{actor}megatron.expert_model_parallel_size": 8,
                     f"{actor}megatron.expert_tensor_parallel_size": 1,
                     f"{actor}megatron.param_offload": True, f"{actor}megatron.grad_offload": True,
                     f"{actor}megatron.optimizer_offload": True, f"{actor}megatron.use_mbridge": True,
                     f"{actor}megatron.vanilla_mbridge": True,
                     f"{actor}megatron.override_transformer_config.moe_router_dtype": "fp32",
                     f"{actor}megatron.override_transformer_config.recompute_method": "uniform",
                     f"{actor}megatron.override_transformer_config.recompute_granularity": "full",
                     f"{actor}megatron.override_transformer_config.recompute_num_layers": 1,
                     f"{actor}optim.lr": 1e-6, "trainer.n_gpus_per_node": 16, "trainer.nnodes": 1},
                    device="npu")
    assert out["strategy"] == "mindspeed_megatron"
    assert out["layout"] == {"tp": 2, "pp": 1, "ep": 8, "etp": 1, "sequence_parallel": True, "nodes": 1,
                             "nproc_per_node": 16, "dp": 8}
    assert out["mcore_kwargs"] == {"use_distributed_optimizer": True, "moe_router_dtype": "fp32",
                                   "recompute_method": "uniform", "recompute_granularity": "full",
                                   "recompute_num_layers": 1}


@pytest.mark.parametrize(("verl", "key", "message"), [
    # Only: a value no engine runs
    ({"actor_rollout_ref.actor.optim.num_cycles": 1.0}, "actor_rollout_ref.actor.optim.num_cycles",
     "1.0 is refused: the workload's cosine is a half cycle"),
    ({"actor_rollout_ref.actor.optim.betas": [0.9, 0.95]}, "actor_rollout_ref.actor.optim.betas",
     "refused: the harness's optimizers and its reference use AdamW betas"),
    ({"strategy": "megatron", "use_megatron_fsdp": True}, "use_megatron_fsdp", "Megatron-FSDP is another engine"),
    # unknown keys, with did-you-mean
    ({"actor_rollout_ref.actor.megatron.tensor_model_paralel_size": 2},
     "actor_rollout_ref.actor.megatron.tensor_model_paralel_size", "did you mean 'tensor_model_parallel_size'"),
    # a block the strategy does not read
    ({"strategy": "fsdp", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 2},
     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "read by verl's megatron engines only"),
    ({"strategy": "fsdp", "use_distributed_optimizer": True}, "use_distributed_optimizer",
     "read by verl's megatron engines only"),
    # outside the engine blocks
    ({"actor_rollout_ref.actor.clip_ratio": 0.2}, "actor_rollout_ref.actor.clip_ratio", "workload sets the loss"),
    ({"actor_rollout_ref.model.path": "/m"}, "actor_rollout_ref.model.path", "the model comes from the scenario"),
    ({"trainer.total_epochs": 3}, "trainer.total_epochs", "only trainer.n_gpus_per_node"),
    # a value verl would reject too
    ({"strategy": "megatron", "tensor_model_parallel_size": 0}, "tensor_model_parallel_size", "not a parallel degree"),
    ({"actor_rollout_ref.actor.megatron.dtype": "fp8"}, "actor_rollout_ref.actor.megatron.dtype", "unknown dtype"),
    # an interpolation whose value matters
    ({"actor_rollout_ref.actor.optim.lr": "${data.lr}"}, "actor_rollout_ref.actor.optim.lr", "OmegaConf interpolation"),
])
def test_each_refusal_names_the_key_and_why(verl, key, message):
    with pytest.raises(ScenarioError, match=r"key 'verl\.") as caught:
        _scenario(verl)
    assert caught.value.key == f"verl.{key}" and message in caught.value.detail


def test_every_refused_key_is_listed_in_one_error():
    with pytest.raises(ScenarioError) as caught:
        _scenario({"actor_rollout_ref.actor.optim.num_cycles": 1.0,
                   "actor_rollout_ref.actor.megatron.use_megatron_fsdp": True})
    assert "num_cycles" in caught.value.key and "use_megatron_fsdp" in caught.value.detail


def test_oc_select_references_resolve_against_the_block():
    actor = "actor_rollout_ref.actor."
    out = _scenario({f"{actor}strategy": "megatron", f"{actor}megatron.use_distributed_optimizer":
                     "${oc.select:actor_rollout_ref.actor.megatron.sequence_parallel,True}",
                     f"{actor}megatron.sequence_parallel": False, f"{actor}megatron.tensor_model_parallel_size": 2})
    assert out["mcore_kwargs"] == {"use_distributed_optimizer": False}


def test_the_scenarios_own_fields_and_verl_agree_or_fail():
    assert _scenario({"actor_rollout_ref.actor.optim.lr": 1e-6}, workload={"lr": 1e-6})["workload"]["lr"] == 1e-6
    with pytest.raises(ScenarioError, match="verl sets 2e-06, the scenario's workload 1e-06: give it once"):
        _scenario({"actor_rollout_ref.actor.optim.lr": 2e-6}, workload={"lr": 1e-6})


def test_every_strategy_family_is_a_harness_engine():
    from parity.harness.config.registry import SPECS

    assert set(FAMILIES) <= set(SPECS)


@pytest.mark.parametrize(("verl", "strategy"), [
    ({"actor_rollout_ref.actor.fsdp_config.strategy": "fsdp2", "actor_rollout_ref.actor.fsdp_config.fsdp_size": 2},
     "fsdp2"),  # the strategy given inside verl's FSDP block
    ({"actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 2}, "megatron"),  # the block's implied engine
    ({"actor_rollout_ref.actor.optim.lr": 1e-6}, "fsdp2"),  # no engine block: verl's default strategy
    ({"strategy": "fsdp", "ulysses_sequence_parallel_size": 2}, "fsdp2"),  # verl's name, an alias
    ({"strategy": "megatron", "device": "npu", "tensor_model_parallel_size": 2}, "mindspeed_megatron"),  # PR #7374
])
def test_the_engine_a_verl_block_means_comes_from_the_specs_verl_names(verl, strategy):
    assert _scenario(verl)["strategy"] == strategy


# ---- verl's generated blocks through both spellings, and refusals against the EngineSpecs ---------------------------
#: the engines a generated block is for: the harness's own (a `verl:` block) and verl's own (`actor_rollout_ref`)
VERL_BLOCK_ENGINES = [spec.name for spec in BUILTIN if spec.verl is not None]
VERL_TREE_ENGINES = [spec.name for spec in BUILTIN if "actor_rollout_ref" in spec.kwargs_blocks]


def _family(engine: str) -> str:
    spec = SPECS[engine]
    if spec.verl is not None:
        return spec.verl.family
    return "megatron" if "megatron" in spec.engine else "fsdp"


GENERATED_FILES = {"megatron": ("_generated_ppo_megatron_trainer.yaml", "megatron"),
                   "fsdp": ("_generated_ppo_trainer.yaml", "fsdp_config")}


def _generated(family: str) -> dict[str, Any]:
    """verl's generated engine blocks as the verl that runs them writes them: the installed verl's own file in the
    verl lane, the stored copy elsewhere."""
    if importlib.util.find_spec("verl") is None:
        return copy.deepcopy(GENERATED[family])
    name, block = GENERATED_FILES[family]
    actor = _installed_verl_config(name)["actor_rollout_ref"]["actor"]
    return {"actor_rollout_ref": {"actor": {key: actor[key] for key in ("strategy", block, "optim")}}}


def _load(write_yaml, entry: dict[str, Any], **workload: Any):
    path = write_yaml(yaml.safe_dump({"defaults": {"model": "tiny-qwen3", "device": "cpu"},
                                      "matrix": [{**entry, "workload": workload}]}))
    (scenario,) = load_file(path)
    return scenario


@pytest.mark.parametrize("engine", VERL_BLOCK_ENGINES)
def test_verls_generated_block_is_a_valid_verl_block_for_each_engine_that_runs_it(write_yaml, engine):
    tree = _generated(_family(engine))
    actor = tree["actor_rollout_ref"]["actor"]
    for block in (actor, *(b for b in actor.values() if isinstance(b, dict) and "strategy" in b)):
        block["strategy"] = engine  # the name this engine has in verl's vocabulary of PR #6316
    scenario = _load(write_yaml, {"verl": tree})
    assert scenario.strategy == engine and layout_errors(scenario) == []


@pytest.mark.parametrize("engine", VERL_TREE_ENGINES)
def test_verls_generated_block_is_a_valid_actor_rollout_ref_for_each_verl_engine(write_yaml, engine):
    tree = _generated(_family(engine))["actor_rollout_ref"]
    # verl's generated config leaves the micro-batch to the command line, which verl's own check requires
    tree["actor"]["ppo_micro_batch_size_per_gpu"] = 2
    # verl's Megatron engine builds Megatron's param groups: the workload must say so (engines/verl/rules.py)
    exempt = "biases_and_norms" if _family(engine) == "megatron" else "none"
    scenario = _load(write_yaml, {"strategy": engine, "actor_rollout_ref": tree}, loss="grpo",
                     weight_decay_exempt=exempt)
    errors = layout_errors(scenario)
    if _family(engine) == "megatron" and not _has_megatron_bridge():  # the generated default needs it installed
        errors.remove(("actor_rollout_ref.actor.megatron.vanilla_mbridge", next(
            message for key, message in errors if key.endswith("vanilla_mbridge") and "not installed" in message)))
    assert scenario.strategy == engine and errors == []


@pytest.mark.parametrize("packed", list(verl_keys.PACKING))
@pytest.mark.parametrize("engine", [name for name in VERL_BLOCK_ENGINES if _family(name) == "megatron"])
def test_every_packing_is_taken_in_verls_spelling_and_judged_by_the_spec(write_yaml, engine, packed):
    """verl's Megatron block carries use_remove_padding: it is the workload's packing, and validation takes or
    refuses it from the engine's spec (EngineSpec.packings), never the vocabulary."""
    scenario = _load(write_yaml, {"verl": {"strategy": engine, "use_remove_padding": packed}})
    refused = [e for e in layout_errors(scenario) if e[0] == "workload.packing"]
    assert scenario.workload.packing == verl_keys.PACKING[packed]
    assert bool(refused) == (scenario.workload.packing not in SPECS[engine].packings)


@pytest.mark.parametrize("scheduler", ["constant", "cosine", "linear"])
@pytest.mark.parametrize("family", ["megatron", "fsdp"])
def test_every_schedule_is_taken_in_verls_spelling(family, scheduler):
    name = "lr_decay_style" if family == "megatron" else "lr_scheduler_type"
    out = _scenario({"strategy": {"megatron": "megatron", "fsdp": "fsdp2"}[family],
                     f"{ACTOR}optim.{name}": scheduler, f"{ACTOR}optim.lr_warmup_steps": 2})
    assert out["workload"]["lr_scheduler_type"] == scheduler and out["workload"]["lr_warmup_steps"] == 2


#: workload fields whose support an EngineSpec states (packings, loss_agg_modes, rl_step) or every engine implements
#: (the schedule): a verl key meaning one of them is translated into it, never refused by the vocabulary
CAPABILITIES = {"workload.packing", "workload.loss_agg_mode", *(f"workload.{f}" for f in RL_STEP_FIELDS),
                *(f"workload.{f}" for f in SCHEDULE_FIELDS)}


@pytest.mark.parametrize("table", [verl_keys.FSDP, verl_keys.MEGATRON], ids=["fsdp", "megatron"])
def test_no_key_of_verls_own_engines_is_both_a_field_and_refused(table):
    assert set(table.shared).isdisjoint(table.refused)


def test_no_verl_block_refuses_a_key_that_means_a_capability():
    """Every verl key the key tables read as a capability field is a `To` in the `verl:` block's rules; a refusal
    whose reason is a way of feeding rows (the stale 'feed padded batches') would outlive EngineSpec.packings."""
    for table in (verl_keys.FSDP, verl_keys.MEGATRON):
        for key, field in table.shared.items():
            block, _, inner = key.removeprefix("actor.").partition(".")
            if field in CAPABILITIES and block in BLOCKS:
                assert not isinstance(BLOCKS[block].get(inner), Only), f"{key} is refused, but means {field}"
    assert BLOCKS["megatron"]["use_remove_padding"] == To("workload.packing", BLOCKS["megatron"]["use_remove_padding"]
                                                          .convert)


@pytest.mark.parametrize("engine", VERL_TREE_ENGINES)
@pytest.mark.parametrize("key", sorted(verl_keys.RL_STEP_SHARED))
def test_an_rl_step_key_is_refused_by_the_engine_spec_only(write_yaml, engine, key):
    """A verl engine's RL-step key away from its default: taken where the spec implements it, refused naming the
    engine's spec where not, never by the key table."""
    field = verl_keys.RL_STEP_SHARED[key].removeprefix("workload.")
    value = {"use_kl_loss": True, "policy_loss": "gspo", "ppo_epochs": 2, "clip_ratio_c": 2.5, "kl_loss_coef": 0.05,
             "kl_loss_type": "k2"}[field]
    assert Workload.model_fields[field].default != value
    scenario = _load(write_yaml, {"strategy": engine, "actor_rollout_ref": {key: value}}, loss="grpo")
    assert getattr(scenario.workload, field) == value
    errors = layout_errors(scenario)
    if field in SPECS[engine].rl_step:
        assert not [e for e in errors if field in e[0]]
    else:
        assert (f"workload.{field}", f"engine '{engine}' does not implement verl's RL-step setting {field} (it "
                                     f"implements {', '.join(SPECS[engine].rl_step) or 'none'})") in errors


def test_rl_step_keys_name_rl_step_fields():
    assert {f.removeprefix("workload.") for f in verl_keys.RL_STEP_SHARED.values()} <= set(RL_STEP_FIELDS)
