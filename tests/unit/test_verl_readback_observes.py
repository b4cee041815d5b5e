"""Read-backs observe (issue 33): every verl read-back rule is listed with the object verl built or the call verl
made that it reads (engines/verl/readback.py OBSERVES), and the rules that read what verl did while it ran answer
with what was observed, not with the request: given observations that disagree with the scenario, an echo rule
would return the request and FAIL here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from parity.engines.verl import observe, readback


def test_every_rule_is_classified_as_observing_something_verl_built_or_did():
    pytest.importorskip("verl")
    import parity.engines.verl.fsdp
    import parity.engines.verl.megatron  # noqa: F401

    assert set(readback.RULES) == set(readback.OBSERVES)


def _engine(**observed):
    seen = observe.Observations()
    for name, value in observed.items():
        setattr(seen, name, value)
    tree = {"actor_rollout_ref": SimpleNamespace(rollout=SimpleNamespace(n=4))}
    return SimpleNamespace(observed=seen, tree=tree, sequence_parallel_size=lambda: 1,
                           engine=SimpleNamespace(get_data_parallel_size=lambda: 2),
                           ctx=SimpleNamespace(scenario=SimpleNamespace(device="cpu")))


def _call(**fields):
    base = dict(loss_mode="vanilla", loss_agg_mode="token-mean", clip_ratio=0.2, clip_ratio_low=0.2,
                clip_ratio_high=0.2, clip_ratio_c=3.0)
    return observe.PolicyLossCall(**{**base, **fields})


# (rule, key, the scenario's request, observations that disagree with it, what verl did)
CASES = [
    ("policy_loss_call", "actor.clip_ratio_high", 0.28, {"policy_losses": [_call(clip_ratio_high=0.2)]}, 0.2),
    ("policy_loss_call", "actor.clip_ratio_c", 2.5, {"policy_losses": [_call()]}, 3.0),
    ("policy_loss_call", "actor.policy_loss.loss_mode", "gspo", {"policy_losses": [_call()]}, "vanilla"),
    ("policy_loss_call", "actor.loss_agg_mode", "seq-mean-token-mean", {"policy_losses": [_call()]}, "token-mean"),
    ("loss_config", "actor.kl_loss_coef", 0.05, {"loss_configs": [SimpleNamespace(kl_loss_coef=0.001)]}, 0.001),
    ("kl_loss", "actor.use_kl_loss", True, {"kl_types": []}, False),
    ("kl_loss", "actor.kl_loss_type", "k2", {"kl_types": ["low_var_kl"]}, "low_var_kl"),
    # 4 rows per mini-batch per rank x dp 2 / rollout_n 4 = 2 prompts, not the 4 requested
    ("global_batch", "actor.ppo_mini_batch_size", 4,
     {"mini_batches": [observe.MiniBatches(mini_batch_size=4, epochs=1, batch_rows=8, rows=[4, 4])]}, 2),
    ("epochs", "actor.ppo_epochs", 2,
     {"mini_batches": [observe.MiniBatches(mini_batch_size=8, epochs=1, batch_rows=8, rows=[8])]}, 1),
    ("clip_threshold", "actor.optim.clip_grad", 1.0, {"clip_max_norms": [5.0, 5.0]}, 5.0),
    ("optimizer_group", "actor.optim.weight_decay", 0.1, {"optimizer_groups": [[{"weight_decay": 0.0}]]}, 0.0),
    ("packed_path", "model.use_remove_padding", True, {"forward_inputs": [((2, 32), True)]}, False),
    ("micro_batches", "actor.use_dynamic_bsz", True,
     {"micro_batching": [observe.MicroBatching("train", False, (2, 2), (40, 40))]}, False),
]


@pytest.mark.parametrize(("rule", "key", "requested", "observed", "effective"), CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_a_rule_answers_with_what_verl_did_not_with_the_request(rule, key, requested, observed, effective):
    engine = _engine(**observed)
    fn = getattr(readback.RULES[rule], "__wrapped__", readback.RULES[rule])
    assert fn(engine, key, requested) == effective


@pytest.mark.parametrize(("rule", "key", "requested", "observed", "effective"), CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_the_clean_twin_agrees_where_verl_did_what_was_asked(rule, key, requested, observed, effective):
    """The same rule with the request set to what verl did: agreeing, it answers with the request."""
    engine = _engine(**observed)
    assert readback.RULES[rule](engine, key, effective) == effective


def test_nothing_observed_is_never_the_request():
    engine = _engine()
    answers = [(rule, key, requested, readback.RULES[rule](engine, key, requested))
               for rule, key, requested, _, _ in CASES]
    assert answers
    echoes = [(rule, key, answer) for rule, key, requested, answer in answers
              if answer == requested and requested is not False]
    assert echoes == []


def test_an_echo_rule_is_caught(monkeypatch):
    """Planted: the mini-batch read-back answering the request (as the harness's former rows x dp did)."""
    monkeypatch.setitem(readback.RULES, "global_batch", lambda engine, key, requested: requested)
    rule, key, requested, observed, effective = next(c for c in CASES if c[0] == "global_batch")
    assert readback.RULES[rule](_engine(**observed), key, requested) != effective


def test_a_token_budget_exceeded_says_whether_verl_could_have_split_the_micro_batch():
    """Two sequences over the budget in one micro-batch: verl's balanced partition kept them together (verl's main
    branch at 1dda039b9 does, its 0.9.1 release raises the count until each fits); one sequence over it cannot be
    split. A micro-batch within the budget agrees."""
    def effective(tokens, rows):
        engine = _engine(micro_batching=[observe.MicroBatching("train", True, rows, tokens)])
        return readback.RULES["micro_batches"](engine, "actor.ppo_max_token_len_per_gpu", 40)

    assert effective((23, 40), (1, 2)) == 40
    assert effective((46, 20), (2, 1)) == ("a micro-batch of 46 tokens in 2 sequences (budget 40); verl did not "
                                           "split them (its balanced partition: verl/utils/seqlen_balancing.py "
                                           "rearrange_micro_batches)")
    assert effective((46, 20), (1, 1)) == "a micro-batch of 46 tokens in 1 sequence (budget 40)"
