"""The verl scenario keys, before anything runs: the verbatim actor_rollout_ref tree is flattened, keys that restate
a scenario field set it or must agree with it, and what the harness cannot follow or verify is bad input (exit 2).
Torch-free and verl-free checks; those that need verl's own config run where verl is installed."""

from __future__ import annotations

import re

import pytest

from parity.engines.verl import source
from parity.engines.verl.keys import FSDP, same_value
from parity.engines.verl.vocabulary import prepare_tree as prepare
from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file
from parity.harness.contract.config_tree import flatten
from tests.conftest import run_cli

pytestmark = pytest.mark.torch_free

needs_verl = pytest.mark.skipif(source.problem() is not None, reason=f"verl lane only: {source.problem()}")


def _scenario(write_yaml, body: str, strategy: str = "verl_fsdp"):
    path = write_yaml(f"""
        defaults: {{device: cpu}}
        matrix:
          - model: tiny-qwen3
            strategy: {strategy}
            layout: {{dp: 2}}
{body}
        """)
    return path, load_file(path)


def test_nested_and_dotted_keys_flatten_to_one_dotted_key_per_leaf():
    flat, problems = flatten({"actor": {"optim": {"lr": 1e-6}, "fsdp_config.reshard_after_forward": False,
                                        "fsdp_config": {"mixed_precision": {"param_dtype": "bf16"}}},
                              "model.override_config": {"attn_implementation": "sdpa"}, "model.lora": {}})
    assert problems == []
    assert flat == {"actor.optim.lr": 1e-6, "actor.fsdp_config.reshard_after_forward": False,
                    "actor.fsdp_config.mixed_precision.param_dtype": "bf16",
                    "model.override_config.attn_implementation": "sdpa", "model.lora": {}}


def test_a_key_given_twice_is_refused():
    _, problems = flatten({"actor": {"optim.lr": 1e-6, "optim": {"lr": 2e-6}}})
    assert problems and "given twice" in problems[0][1]


def test_keys_outside_actor_model_and_ref_are_refused():
    _, problems = prepare({"actor_rollout_ref": {"rollout": {"temperature": 0.5}, "critic": {"x": 1}}}, FSDP)
    only = "actor, model and ref sections only (and rollout.n, the group size)"
    assert problems == [("actor_rollout_ref.rollout.temperature", f"the verl engines read actor_rollout_ref's {only}"),
                        ("actor_rollout_ref.critic.x", f"the verl engines read actor_rollout_ref's {only}")]


def test_a_verl_key_sets_the_scenario_field_it_restates():
    out, problems = prepare({"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "clip_ratio_high": 0.28}}}, FSDP)
    assert problems == []
    # DAPO's clip-higher: verl's clip_ratio_high is the workload's own field; the lower clip stays clip_ratio's
    assert out["workload"]["lr"] == 1e-6 and out["workload"]["clip_ratio_high"] == 0.28
    assert out["actor_rollout_ref"]["actor.clip_ratio_low"] == 0.2


def test_the_scenario_field_is_written_into_the_verl_tree_when_verl_key_is_absent():
    out, _ = prepare({"dtype": "bf16", "workload": {"lr": 3e-5}, "actor_rollout_ref": {}}, FSDP)
    tree = out["actor_rollout_ref"]
    assert tree["actor.optim.lr"] == 3e-5
    assert tree["actor.fsdp_config.mixed_precision.param_dtype"] == "bfloat16"
    assert tree["actor.optim.weight_decay"] == 0.0  # the workload's default, not verl's 0.01


def test_a_verl_key_disagreeing_with_the_scenario_is_refused():
    _, problems = prepare({"workload": {"lr": 1e-4}, "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}}}, FSDP)
    assert problems == [("actor_rollout_ref.actor.optim.lr",
                         "1e-06 disagrees with the scenario's workload.lr 0.0001: give it once")]
    _, problems = prepare({"workload": {"clip_ratio_high": 0.3},
                           "actor_rollout_ref": {"actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}}}, FSDP)
    assert problems == [("actor_rollout_ref.actor.clip_ratio_high",
                         "0.28 disagrees with the scenario's workload.clip_ratio_high 0.3: give it once")]


def test_dtype_spellings_are_one_value():
    assert same_value("bfloat16", "bf16") and same_value("fp32", "float32") and not same_value("bf16", "fp16")
    assert same_value([0.9, 0.999], (0.9, 0.999)) and same_value(1, 1.0)
    assert not same_value(True, 1) and not same_value(0, False)


@pytest.mark.parametrize(("tree", "message"), [
    ("{model: {lora_rank: 8}}", r"key 'actor_rollout_ref\.model\.lora_rank'.*not a LoRA adapter"),
    ("{actor: {shuffle: true}}", r"actor_rollout_ref\.actor\.shuffle.*in order"),
    # verl builds a ref worker only for the KL loss: its section would be read by nothing
    ("{ref: {fsdp_config: {mixed_precision: {param_dtype: fp32}}}}",
     r"actor_rollout_ref\.ref\.fsdp_config\.mixed_precision\.param_dtype.*only for the KL loss"),
    ("{rollout: {temperature: 0.5}}", r"actor_rollout_ref\.rollout\.temperature.*actor, model and ref sections only"),
    ("{rollout: {n: 4}, actor: {rollout_n: 2}}", r"actor_rollout_ref\.rollout\.n.*disagrees with actor\.rollout_n 2"),
])
def test_refused_keys_are_bad_input_naming_the_key(write_yaml, tree, message):
    from parity.harness.config.validate import check_scenario

    with pytest.raises(ScenarioError, match=message):
        path, scenarios = _scenario(write_yaml, f"            actor_rollout_ref: {tree}")
        check_scenario(scenarios[0].model_copy(update={"source": str(path)}))


def test_a_bad_verl_block_exits_2_naming_file_scenario_and_key(write_yaml):
    path = write_yaml("""
        matrix:
          - {model: tiny-qwen3, strategy: verl_fsdp, layout: {dp: 2},
             actor_rollout_ref: {actor: {strategy: megatron}}}
        """)
    result = run_cli("list", str(path))
    assert result.returncode == 2
    assert str(path) in result.stderr and "tiny-qwen3/verl_fsdp" in result.stderr
    assert "actor_rollout_ref.actor.strategy" in result.stderr and "Traceback" not in result.stderr


@needs_verl
@pytest.mark.parametrize(("key", "message"), [
    ("actor: {fsdp_config: {reshard_after_foward: false}}",
     "actor_rollout_ref.actor.fsdp_config.reshard_after_foward.*has no field 'reshard_after_foward' "
     r"\(did you mean 'reshard_after_forward'\?\)"),
    ("actor: {loss_agg_mode: token-meen}",
     r"actor_rollout_ref\.actor\.loss_agg_mode.*'token-meen' cannot be the scenario's workload\.loss_agg_mode"),
    ("actor: {ppo_micro_batch_size_per_gpu: 1, fsdp_config: {entropy_checkpointing: true}}",
     r"actor_rollout_ref\.actor\.fsdp_config\.entropy_checkpointing.*no read-back"),
    ("actor: {ppo_micro_batch_size_per_gpu: 1, use_kl_loss: true}, ref: {fsdp_config: {reshard_after_forward: false}}",
     r"actor_rollout_ref\.ref\.fsdp_config\.reshard_after_forward.*no read-back"),
    ("actor: {fsdp_config: {reshard_after_forward: false}}",  # verl's own check: micro-batches must be set
     r"actor_rollout_ref\.actor.*verl rejects it: \[actor\] Please set at least one of"),
])
def test_verl_rejects_what_verl_would_reject(write_yaml, key, message):
    """In this process (verl's config modules are imported once): the same ScenarioError the CLI prints with exit 2
    (test_a_bad_verl_block_exits_2_naming_file_scenario_and_key runs the CLI)."""
    from parity.harness.config.validate import check_scenario

    path = write_yaml(f"""
        matrix:
          - {{model: tiny-qwen3, strategy: verl_fsdp, layout: {{dp: 2}}, actor_rollout_ref: {{{key}}}}}
        """)
    with pytest.raises(ScenarioError) as caught:
        for scenario in load_file(path):
            check_scenario(scenario)
    assert str(path) in str(caught.value) and re.search(message, str(caught.value)), str(caught.value)


def test_without_verl_the_rows_skip_naming_what_is_missing(monkeypatch):
    monkeypatch.setattr(source, "problem", lambda: "verl is not installed (pip install -e '.[verl]')")
    from parity.harness.config.validate import skip_reason
    from tests.conftest import REPO

    scenario = next(iter(load_file(REPO / "scenarios" / "verl.yaml")))
    assert "verl is not installed" in (skip_reason(scenario) or "")


def test_the_schedule_keys_restate_the_workloads_schedule():
    """verl's warmup and decay keys set the workload's schedule (the reference follows it), or are written from it;
    at their defaults (verl's too) they stay out of the verl tree, so rows that predate them keep their hash."""
    out, problems = prepare({"actor_rollout_ref": {"actor": {"optim": {"lr_warmup_steps": 3,
                                                                       "lr_scheduler_type": "cosine",
                                                                       "min_lr_ratio": 0.1}}}}, FSDP)
    assert problems == []
    assert out["workload"] | {} == {"lr_warmup_steps": 3, "lr_scheduler_type": "cosine", "min_lr_ratio": 0.1}
    written, _ = prepare({"workload": {"lr_warmup_steps_ratio": 0.2}, "actor_rollout_ref": {}}, FSDP)
    assert written["actor_rollout_ref"]["actor.optim.lr_warmup_steps_ratio"] == 0.2
    assert "actor.optim.lr_scheduler_type" not in written["actor_rollout_ref"]
    plain, _ = prepare({"actor_rollout_ref": {}}, FSDP)
    assert not [key for key in plain["actor_rollout_ref"] if "warmup" in key or "scheduler" in key]
    _, disagree = prepare({"workload": {"lr_scheduler_type": "linear"},
                           "actor_rollout_ref": {"actor": {"optim": {"lr_scheduler_type": "cosine"}}}}, FSDP)
    assert disagree and "disagrees with the scenario's workload.lr_scheduler_type" in disagree[0][1]


def test_megatrons_min_lr_is_the_workloads_ratio_times_lr():
    from parity.engines.verl.rules import prepare_megatron

    out, problems = prepare_megatron({"workload": {"lr": 2e-4, "lr_scheduler_type": "cosine", "min_lr_ratio": 0.1},
                                      "actor_rollout_ref": {}})
    assert problems == [] and out["actor_rollout_ref"]["actor.optim.min_lr"] == pytest.approx(2e-5)
    assert out["actor_rollout_ref"]["actor.optim.lr_decay_style"] == "cosine"
    given, problems = prepare_megatron({"workload": {"lr_scheduler_type": "cosine"},
                                        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-3, "min_lr": 1e-4}}}})
    assert problems == [] and given["workload"]["min_lr_ratio"] == pytest.approx(0.1)
    _, problems = prepare_megatron({"workload": {"lr_scheduler_type": "cosine", "min_lr_ratio": 0.5},
                                    "actor_rollout_ref": {"actor": {"optim": {"min_lr": 1e-6}}}})
    assert problems and problems[0][0] == "actor_rollout_ref.actor.optim.min_lr"


@pytest.mark.parametrize("strategy, exempt, ok", [("verl_fsdp", "none", True),
                                                  ("verl_fsdp", "biases_and_norms", False)])
def test_weight_decay_groups_must_be_the_engines(write_yaml, strategy, exempt, ok):
    """verl's FSDP engine decays every parameter: a scenario asking it to exempt norms is bad input, naming the key."""
    from parity.harness.config.validate import layout_errors

    body = f"            workload: {{weight_decay: 0.1, weight_decay_exempt: {exempt}}}"
    _, (scenario,) = _scenario(write_yaml, body, strategy)
    problems = [key for key, _ in layout_errors(scenario)]
    assert ("workload.weight_decay_exempt" not in problems) is ok, problems


def test_the_rl_steps_verl_keys_restate_the_workloads_fields():
    """rollout_n is group_size, ppo_mini_batch_size (prompts) x rollout_n splits the batch into mini_batches, the
    RL keys with a plain field are written only away from their defaults (verl's too)."""
    out, problems = prepare({"workload": {"batch_size": 16},
                             "actor_rollout_ref": {"actor": {"rollout_n": 4, "ppo_mini_batch_size": 2,
                                                             "ppo_epochs": 2, "use_kl_loss": True}}}, FSDP)
    assert problems == []
    assert out["workload"]["group_size"] == 4 and out["workload"]["mini_batches"] == 2
    assert out["workload"]["ppo_epochs"] == 2 and out["workload"]["use_kl_loss"] is True
    out, problems = prepare({"workload": {"batch_size": 16, "group_size": 4, "mini_batches": 2,
                                          "clip_ratio_low": 0.1, "kl_loss_type": "k1"}, "actor_rollout_ref": {}},
                            FSDP)
    tree = out["actor_rollout_ref"]
    assert problems == [] and tree["actor.ppo_mini_batch_size"] == 2 and tree["actor.clip_ratio_low"] == 0.1
    assert tree["actor.kl_loss_type"] == "k1" and "actor.ppo_epochs" not in tree
    _, problems = prepare({"workload": {"batch_size": 16, "group_size": 4, "mini_batches": 4},
                           "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}}}, FSDP)
    assert problems and problems[0][0] == "actor_rollout_ref.actor.ppo_mini_batch_size"
    _, problems = prepare({"workload": {"group_size": 4}, "actor_rollout_ref": {"actor": {"rollout_n": 2}}}, FSDP)
    assert problems == [("actor_rollout_ref.actor.rollout_n",
                         "2 disagrees with the scenario's workload.group_size 4: give it once")]


def test_rollout_n_is_where_verl_users_set_the_group():
    """verl's config sets actor.rollout_n from actor_rollout_ref.rollout.n: either spelling is the group size, and
    the two given apart must agree."""
    out, problems = prepare({"workload": {"batch_size": 16},
                             "actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"ppo_mini_batch_size": 2}}}, FSDP)
    assert problems == [] and out["workload"]["group_size"] == 4 and out["workload"]["mini_batches"] == 2
    assert out["actor_rollout_ref"]["actor.rollout_n"] == 4 and "rollout.n" not in out["actor_rollout_ref"]
    _, problems = prepare({"workload": {"group_size": 4}, "actor_rollout_ref": {"rollout": {"n": 2}}}, FSDP)
    assert problems == [("actor_rollout_ref.actor.rollout_n",
                         "2 disagrees with the scenario's workload.group_size 4: give it once")]


def test_several_mini_batches_at_dp_are_drawn_from_each_ranks_chunk():
    """verl hands each data-parallel rank a consecutive chunk and each cuts its own mini-batches: the workload says
    so (mini_batch_shards = dp); a scenario that insists on consecutive mini-batches at dp 2 is refused."""
    raw = {"layout": {"dp": 2}, "workload": {"batch_size": 16},
           "actor_rollout_ref": {"actor": {"rollout_n": 4, "ppo_mini_batch_size": 2}}}
    out, problems = prepare(raw, FSDP)
    assert problems == [] and out["workload"]["mini_batches"] == 2 and out["workload"]["mini_batch_shards"] == 2
    out, problems = prepare({**raw, "layout": {"dp": 1}}, FSDP)
    assert problems == [] and "mini_batch_shards" not in out["workload"]
    _, problems = prepare({**raw, "workload": {"batch_size": 16, "mini_batch_shards": 1}}, FSDP)
    assert [key for key, _ in problems] == ["workload.mini_batch_shards"]
