"""The reference's own math (parity.reference) against a third source: hand-derived numbers from the papers'
definitions, torch's cross-entropy / entropy, torch.optim's AdamW / SGD, transformers' schedulers. Every check also
runs on a planted wrong twin — the bug a real implementation makes (advantages normalised over the batch instead of
the group, the KL sign flipped, clip_ratio_high ignored, the scheduler stepped per mini-batch, ...) — and must
reject it."""

from __future__ import annotations

import math

import pytest
import torch

from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schema import Fault, Workload
from parity.reference import losses as ref
from parity.reference import optim as ropt


def close(got: torch.Tensor, want: list | float, tol: float = 1e-6) -> bool:
    return torch.allclose(torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64),
                          atol=tol, rtol=0)


# ---- scoring -------------------------------------------------------------------------------------------------
def _wrong_scores_unshifted(logits, labels):  # twin: softmax probabilities, not their log
    p = torch.softmax(logits.float(), -1)
    return p.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(p * p.log()).sum(-1)


@pytest.mark.parametrize(("scores", "right"), [(ref.token_scores, True), (_wrong_scores_unshifted, False)])
def test_token_scores_are_torch_cross_entropy_and_categorical_entropy(scores, right):
    gen = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(3, 5, 11, generator=gen) * 3, torch.randint(0, 11, (3, 5), generator=gen)
    logp, entropy = scores(logits, labels)
    # transformers' causal-LM loss is torch's cross-entropy (loss_utils.ForCausalLMLoss)
    third = -torch.nn.functional.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none")
    agrees = close(logp.reshape(-1), third, 1e-5) and close(
        entropy, torch.distributions.Categorical(logits=logits).entropy(), 1e-5)
    assert agrees is right


def test_response_positions_score_the_next_token():
    logits = torch.arange(6.0).reshape(1, 6, 1)  # position t holds t
    assert ref.response_positions(logits, prompt_len=4).reshape(-1).tolist() == [3.0, 4.0]


# ---- aggregation ---------------------------------------------------------------------------------------------
LOSSES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(("mode", "want"), [
    ("token-mean", (1 + 2 + 4) / 3), ("token-sum", 7.0), ("seq-mean-token-sum", (3 + 4) / 2),
    ("seq-mean-token-mean", (1.5 + 4) / 2), ("seq-mean-token-sum-norm", (3 + 4) / 2 / 3)])
def test_aggregation_by_hand(mode, want):
    assert close(ref.aggregate(mode, LOSSES, MASK, tokens=3.0, sequences=2.0), want)
    # twin: the padding counted (per_token not masked) moves every mode
    assert not close(ref.aggregate(mode, LOSSES, torch.ones_like(MASK), tokens=3.0, sequences=2.0), want)


# ---- advantages ----------------------------------------------------------------------------------------------
REWARDS = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
ROW_MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])


def _grpo_over_batch(scores, group_size):  # twin: normalised over the whole batch
    return (scores - scores.mean()) / (scores.std() + ref.GRPO_EPS)


@pytest.mark.parametrize(("fn", "right"), [(ref.grpo_advantages, True), (_grpo_over_batch, False)])
def test_grpo_normalises_within_each_group(fn, right):
    # group [1, 2, 3]: mean 2, unbiased std 1; group [10, 10, 13]: mean 11, std sqrt(3)
    s3 = math.sqrt(3)
    want = [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), -1 / (s3 + 1e-6), -1 / (s3 + 1e-6), 2 / (s3 + 1e-6)]
    assert close(fn(REWARDS, 3), want) is right


def _rloo_with_self(scores, group_size):  # twin: the baseline includes the response itself
    groups = scores.reshape(-1, group_size)
    return (groups - groups.mean(1, keepdim=True)).reshape(-1)


@pytest.mark.parametrize(("fn", "right"), [(ref.rloo_advantages, True), (_rloo_with_self, False)])
def test_rloo_baseline_is_the_other_responses(fn, right):
    # 1 - (2 + 3) / 2, 2 - (1 + 3) / 2, 3 - (1 + 2) / 2; 10 - 23 / 2, 10 - 23 / 2, 13 - 10
    assert close(fn(REWARDS, 3), [-1.5, 0.0, 1.5, -1.5, -1.5, 3.0]) is right


def test_advantages_sit_on_the_response_tokens_from_the_last_tokens_reward():
    adv = ref.advantages("grpo", REWARDS, ROW_MASK, 3)
    assert adv.shape == ROW_MASK.shape and bool((adv[ROW_MASK == 0] == 0).all())
    assert close(adv[2], [1 / (1 + 1e-6)] * 3)
    token_rewards = ref.outcome_token_rewards(REWARDS, ROW_MASK)
    assert token_rewards[0].tolist() == [0.0, 1.0, 0.0] and token_rewards[2].tolist() == [0.0, 0.0, 3.0]


def _rpp_per_row(token_rewards, mask):  # twin: whitened within each response instead of over the batch
    return torch.stack([ref.reinforce_plus_plus_advantages(r[None], m[None])[0]
                        if m.sum() > 1 else torch.zeros_like(r) for r, m in zip(token_rewards, mask, strict=True)])


@pytest.mark.parametrize(("fn", "right"), [(ref.reinforce_plus_plus_advantages, True), (_rpp_per_row, False)])
def test_reinforce_plus_plus_returns_whitened_over_the_batch(fn, right):
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    token_rewards = ref.outcome_token_rewards(torch.tensor([1.0, 3.0]), mask)
    # returns (gamma 1) [[1, 1, 0], [3, 0, 0]]; real values 1, 1, 3: mean 5/3, unbiased var 4/3
    sd = math.sqrt(4 / 3 + 1e-8)
    want = [[(1 - 5 / 3) / sd, (1 - 5 / 3) / sd, 0.0], [(3 - 5 / 3) / sd, 0.0, 0.0]]
    assert close(fn(token_rewards, mask), want) is right


def test_gae_is_refused_naming_the_critic():
    with pytest.raises(ValueError, match="gae needs a critic"):
        ref.advantages("gae", REWARDS, ROW_MASK, 3)


# ---- KL estimators -------------------------------------------------------------------------------------------
def _kl_flipped(logp, ref_logp, kind):  # twin: KL(reference || policy) estimated with the sign flipped
    return ref.kl_estimate(ref_logp, logp, kind)


@pytest.mark.parametrize(("fn", "right"), [(ref.kl_estimate, True), (_kl_flipped, False)])
def test_kl_estimators_by_hand(fn, right):
    logp, ref_logp = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # log r = log(pi_ref / pi) = -log 2: k1 = log 2, k2 = (log 2)^2 / 2, k3 = r - 1 - log r = 1/2 - 1 + log 2
    want = {"kl": math.log(2), "k1": math.log(2), "mse": 0.5 * math.log(2) ** 2, "k2": 0.5 * math.log(2) ** 2,
            "low_var_kl": 0.5 - 1 + math.log(2), "k3": 0.5 - 1 + math.log(2)}
    assert all(close(fn(logp, ref_logp, kind), value) for kind, value in want.items()) is right
    assert close(fn(logp, ref_logp, "abs"), math.log(2))  # |k1| is symmetric: no twin can show here


# ---- policy losses -------------------------------------------------------------------------------------------
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
RATIO = torch.tensor([[1.5, 0.5, 1.5, 0.5, 5.0]])


def _ppo_symmetric(logp, old, adv, low, high, c):  # twin: clip_ratio_high ignored (the low bound both ways)
    return ref.ppo_dual_clip(logp, old, adv, low, low, c)


def _ppo_no_dual_clip(logp, old, adv, low, high, c):  # twin: the dual clip never applied
    return ref.ppo_dual_clip(logp, old, adv, low, high, math.inf)


@pytest.mark.parametrize(("fn", "right"), [(ref.ppo_dual_clip, True), (_ppo_symmetric, False),
                                           (_ppo_no_dual_clip, False)])
def test_ppo_asymmetric_clip_and_dual_clip_by_hand(fn, right):
    # A=1, r=1.5: max(-1.5, -1.28); A=1, r=0.5: max(-0.5, -0.8); A=-1, r=1.5: min(3, max(1.5, 1.28));
    # A=-1, r=0.5: min(3, max(0.5, 0.8)); A=-1, r=5: min(3, max(5, 1.28)) (dual clip)
    got = fn(RATIO.log(), torch.zeros_like(RATIO), ADV, 0.2, 0.28, 3.0)
    assert close(got, [[-1.28, -0.5, 1.5, 0.8, 3.0]], 1e-6) is right


def _gspo_token_ratio(logp, old, adv, mask, low, high):  # twin: token ratios (vanilla PPO) instead of the sequence's
    return ref.ppo_dual_clip(logp, old, adv, low, high, math.inf)


@pytest.mark.parametrize(("fn", "right"), [(ref.gspo, True), (_gspo_token_ratio, False)])
def test_gspo_sequence_ratio_by_hand(fn, right):
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.2, 0.4, 9.0], [0.1, -0.1, 9.0]], requires_grad=True)  # last column: padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3])
    losses = fn(logp, old, adv, mask, 0.2, 0.28)
    # row 0: s = exp(mean(0.2, 0.4)) = e^0.3 = 1.35 > 1.28 -> clipped, -1.28; row 1: s = e^0 = 1 -> 2
    assert close(losses * mask, [[-1.28, -1.28, 0.0], [2.0, 2.0, 0.0]], 1e-6) is right
    if right:  # the gradient flows per token through sg[s] * pi_t / sg[pi_t]: d/dlogp_t = -A * s on row 1
        (losses * mask).sum().backward()
        assert close(logp.grad, [[0.0, 0.0, 0.0], [2.0, 2.0, 0.0]])


def test_clip_cov_cuts_the_gradient_of_the_high_covariance_token():
    # advantages centred 0 over the real tokens; token (0, 0): cov = (2 - 0) * (logp - mean) in (1, 5)
    adv = torch.tensor([[2.0, -2.0], [0.5, -0.5]])
    logp = torch.tensor([[1.0, 0.0], [0.0, -1.0]], requires_grad=True)
    old = logp.detach().clone()  # ratio 1: nothing clipped
    mask = torch.ones(2, 2)
    losses = ref.clip_cov(logp, old, adv, mask, 0.2, 0.2)
    # mean logp 0: covs 2*1 = 2 (in (1, 5)), -2*0 = 0, 0.5*0 = 0, -0.5*-1 = 0.5: only (0, 0) qualifies
    assert close(losses, [[0.0, 2.0], [-0.5, 0.5]])
    losses.sum().backward()
    assert close(logp.grad, [[0.0, 2.0], [-0.5, 0.5]])


def test_kl_cov_adds_the_abs_kl_on_the_largest_covariance_token():
    adv = torch.tensor([[2.0, -2.0], [0.5, -0.5]])
    old = torch.tensor([[1.0, 0.0], [0.0, -1.0]])
    logp = old + torch.tensor([[0.3, 0.1], [-0.2, 0.1]])
    losses = ref.kl_cov(logp, old, adv, torch.ones(2, 2))
    # covs over real tokens (means: A 0, logp 0.075): largest is (0, 0): + ppo_kl_coef |0.3|, verl's config
    # default coefficient 0.1 (verl/workers/config/actor.py PolicyLossConfig)
    want = -adv * torch.exp(logp - old)
    want[0, 0] += 0.1 * 0.3
    assert close(losses, want)


# ---- the step's loss -----------------------------------------------------------------------------------------
def test_step_loss_entropy_bonus_and_kl_loss_by_hand():
    workload = Workload(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1", entropy_coeff=0.1)
    logp = torch.tensor([[math.log(0.5), math.log(0.5)]])
    entropy, mask = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    loss = ref.step_loss(workload, logp, entropy, logp, torch.tensor([[1.0, 1.0]]), mask, 2.0, 1.0,
                         ref_logp=torch.tensor([[math.log(0.25), math.log(0.5)]]))
    # ratio 1: pg = -1 per token; - 0.1 * mean(1, 3) + 0.5 * mean(log 2, 0)
    assert close(loss, -1 - 0.1 * 2 + 0.5 * math.log(2) / 2)
    flipped = ref.step_loss(workload, logp, entropy, logp, torch.tensor([[1.0, 1.0]]), mask, 2.0, 1.0,
                            ref_logp=logp - (torch.tensor([[math.log(0.25), math.log(0.5)]]) - logp))
    assert not close(flipped, -1 - 0.1 * 2 + 0.5 * math.log(2) / 2)


def test_gspo_aggregates_its_policy_term_per_sequence_the_rest_in_the_workloads_mode():
    workload = Workload(policy_loss="gspo", entropy_coeff=0.0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0] * 3, [3.0] * 3])
    zeros = torch.zeros(2, 3)
    # ratio 1: seq-mean-token-mean of -A = (-1 - 3) / 2 (token-mean would be (-3 - 3) / 4)
    assert close(ref.step_loss(workload, zeros, zeros, zeros, adv, mask, 4.0, 2.0), -2.0)


# ---- optimizer -----------------------------------------------------------------------------------------------
def _params():
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)]


def _run(build, steps=3):
    params = [p.clone().requires_grad_(True) for p in _params()]
    opt = build([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}])
    gen = torch.Generator().manual_seed(9)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params, opt


class _AdamWithoutBiasCorrection(ropt.AdamW):  # twin: Adam's bias correction left out
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 0.1)
                state["exp_avg_sq"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(1e-8), value=-group["lr"])


@pytest.mark.parametrize(("kind", "right"), [(ropt.AdamW, True), (_AdamWithoutBiasCorrection, False)])
def test_adamw_is_torch_adamw_bit_for_bit(kind, right):
    ours, opt = _run(lambda groups: kind(groups, lr=1e-2, weight_decay=0.1))
    theirs, _ = _run(lambda groups: torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1, foreach=False))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)) is right
    assert float(opt.state[ours[0]]["step"]) == 3  # read back by optim_state.torch_optimizer_steps


def test_sgd_is_torch_sgd_bit_for_bit():
    ours, _ = _run(lambda groups: ropt.SGD(groups, lr=1e-2, weight_decay=0.1))
    theirs, _ = _run(lambda groups: torch.optim.SGD(groups, lr=1e-2, weight_decay=0.1))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_decay_groups_and_the_fault_that_decays_norms():
    named = [("w.weight", torch.zeros(2, 2)), ("w.bias", torch.zeros(2)), ("norm.weight", torch.zeros(2))]
    workload = Workload(weight_decay=0.1, weight_decay_exempt="biases_and_norms")
    opt = ropt.build_optimizer(named, workload, FaultPlan())
    assert [len(g["params"]) for g in opt.param_groups] == [1, 2]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert isinstance(ropt.build_optimizer(named, workload.model_copy(update={"optimizer": "sgd"}), FaultPlan()),
                      ropt.SGD)


# ---- schedule ------------------------------------------------------------------------------------------------
SCHEDULES = [dict(lr_scheduler_type="constant", lr_warmup_steps=2, steps=6),
             dict(lr_scheduler_type="cosine", lr_warmup_steps=2, min_lr_ratio=0.1, steps=7),
             dict(lr_scheduler_type="cosine", lr_warmup_steps_ratio=0.3, steps=10),
             dict(lr_scheduler_type="linear", lr_warmup_steps=1, steps=5)]


def _transformers_lrs(workload):
    from transformers import optimization

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=workload.lr)
    warmup = workload.lr_warmup_steps if workload.lr_warmup_steps > 0 else int(
        workload.lr_warmup_steps_ratio * workload.steps)
    build = {"constant": lambda: optimization.get_constant_schedule_with_warmup(opt, warmup),
             "cosine": lambda: optimization.get_cosine_with_min_lr_schedule_with_warmup(
                 opt, warmup, workload.steps, min_lr_rate=workload.min_lr_ratio),
             "linear": lambda: optimization.get_linear_schedule_with_warmup(opt, warmup, workload.steps)}
    return _stepped(opt, build[workload.lr_scheduler_type](), workload.steps)


def _lrs(workload, faults=None):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=workload.lr)
    return _stepped(opt, ropt.build_scheduler(opt, workload, faults or FaultPlan()), workload.steps)


def _stepped(opt, scheduler, steps: int) -> list[float]:
    """The lr of each step, the scheduler stepped after each."""
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("settings", SCHEDULES, ids=lambda s: s["lr_scheduler_type"])
def test_schedule_is_transformers_schedulers_exactly(settings):
    workload = Workload(lr=1e-3, **settings)
    assert _lrs(workload) == _transformers_lrs(workload)
    # twin: the warmup ignored (fault lr_warmup_ignored) moves the first steps
    assert _lrs(workload, FaultPlan((Fault(kind="lr_warmup_ignored"),))) != _transformers_lrs(workload)


def test_cosine_by_hand():
    # warmup 2 of 6, floor 0.1: 0, 1/2, then 0.1 + 0.9 * (1 + cos(pi * k / 4)) / 2 for k = 0..3
    want = [0.0, 0.5] + [0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(4)]
    got = [ropt.lr_multiplier("cosine", s, 2, 6, 0.1) for s in range(6)]
    assert close(got, want, 1e-12)


# ---- the order of a step's updates ---------------------------------------------------------------------------
def _per_mini_batch(workload):  # twin: the scheduler stepped after every mini-batch
    return [ropt.Update(u.epoch, u.rows, True) for u in ropt.update_plan(workload)]


@pytest.mark.parametrize(("plan", "right"), [(ropt.update_plan, True), (_per_mini_batch, False)])
def test_updates_run_mini_batches_in_order_and_step_the_scheduler_once_per_step(plan, right):
    workload = Workload(batch_size=8, mini_batches=2, ppo_epochs=2, steps=3, lr=1e-3, lr_warmup_steps=2)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=workload.lr)
    scheduler = ropt.build_scheduler(opt, workload, FaultPlan())
    seen = []
    for _ in range(workload.steps):
        for update in plan(workload):
            seen.append((update.epoch, int(update.rows[0]), int(update.rows[-1]) + 1, opt.param_groups[0]["lr"]))
            opt.step()
            if update.step_scheduler:
                scheduler.step()
    rows = [(0, 0, 4), (0, 4, 8), (1, 0, 4), (1, 4, 8)] * 3
    lrs = [0.0] * 4 + [5e-4] * 4 + [1e-3] * 4  # warmup 2 steps: 0, 1/2, 1 per STEP
    assert [s[:3] for s in seen] == rows
    assert close([s[3] for s in seen], lrs, 1e-12) is right


def test_mini_batches_drawn_from_shards_are_every_shards_slice():
    """verl at dp 2: each rank's consecutive half of the batch, cut into its own mini-batches, so the u-th mini-batch
    is rows u-th quarter of each half; the twin (one shard) takes consecutive quarters."""
    sharded = Workload(batch_size=16, mini_batches=2, mini_batch_shards=2, ppo_epochs=2)
    plan = [u.rows.tolist() for u in ropt.update_plan(sharded)]
    assert plan == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]] * 2
    consecutive = Workload(batch_size=16, mini_batches=2, ppo_epochs=1)
    assert [u.rows.tolist() for u in ropt.update_plan(consecutive)] == [list(range(8)), list(range(8, 16))]
    with pytest.raises(ValueError, match="splits a group of 4"):
        Workload(batch_size=16, mini_batches=2, mini_batch_shards=4, group_size=4, adv_estimator="grpo",
                 advantages="seeded")
