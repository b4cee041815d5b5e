"""The candidates' side of the math written twice (harness/contract/losses.py, engines/training.py) against the same
third sources as the reference's (tests/unit/test_reference_math.py): torch's cross-entropy and Categorical entropy,
hand-derived aggregations, torch.optim and transformers' schedulers are what engines/training.py builds. Each with a
planted wrong twin."""

from __future__ import annotations

import pytest
import torch

from parity.engines.training import make_optimizer
from parity.harness.contract import losses
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schema import Workload


def _probabilities_not_logs(logits, labels):  # twin: softmax probabilities instead of their log
    p = torch.softmax(logits.float(), -1)
    return p.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(p * p.log()).sum(-1)


@pytest.mark.parametrize(("scores", "right"), [(losses.logprobs_and_entropy, True),
                                               (_probabilities_not_logs, False)])
def test_candidate_scores_are_torch_cross_entropy_and_categorical_entropy(scores, right):
    gen = torch.Generator().manual_seed(4)
    logits, labels = torch.randn(2, 6, 13, generator=gen) * 3, torch.randint(0, 13, (2, 6), generator=gen)
    logp, entropy = scores(logits, labels)
    third = -torch.nn.functional.cross_entropy(logits.reshape(-1, 13), labels.reshape(-1), reduction="none")
    agrees = torch.allclose(logp.reshape(-1), third, atol=1e-5) and torch.allclose(
        entropy, torch.distributions.Categorical(logits=logits).entropy(), atol=1e-5)
    assert agrees is right


LOSSES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(("mode", "want"), [
    ("token-mean", (1 + 2 + 4) / 3), ("token-sum", 7.0), ("seq-mean-token-sum", (3 + 4) / 2),
    ("seq-mean-token-mean", (1.5 + 4) / 2), ("seq-mean-token-sum-norm", (3 + 4) / 2 / 3)])
def test_candidate_aggregation_by_hand(mode, want):
    assert float(losses.aggregate(mode, LOSSES, MASK, 3.0, 2.0)) == pytest.approx(want, abs=1e-6)
    assert float(losses.aggregate(mode, LOSSES, torch.ones_like(MASK), 3.0, 2.0)) != pytest.approx(want, abs=1e-6)


def test_candidate_clip_by_hand():
    # A = 1, ratio 1.5 clipped at 1.2; A = -1, ratio 0.5 clipped at 0.8 (symmetric clip_ratio 0.2, no entropy)
    workload = Workload(entropy_coeff=0.0)
    ratio = torch.tensor([[1.5, 0.5]])
    got = losses.token_losses(workload, ratio.log(), torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(got, torch.tensor([[-1.2, 0.8]]))


def test_candidate_optimizer_is_torch_adamw_over_the_decay_groups():
    named = [("w.weight", torch.zeros(2, 2)), ("w.bias", torch.zeros(2))]
    opt = make_optimizer(named, Workload(weight_decay=0.1, weight_decay_exempt="biases_and_norms"), FaultPlan())
    assert type(opt) is torch.optim.AdamW and [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
