"""`parity bisect` over verl's history (PARITY_VERL_SRC, as the nightly's verl-main job runs verl's main branch): a
git repository of the installed verl's source with a regression committed between two harmless commits (the
policy losses' ratio scaled 1 % in verl/trainer/ppo/core_algos.py). The bisection runs a verl row against each
candidate tree and must name that commit. Needs verl (the nightly's verl job runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.multiproc.test_bisect import planted_history

pytestmark = [pytest.mark.multiprocess, pytest.mark.nightly]
ROW = "tiny-qwen3/verl_fsdp/dp2/fp32/cpu+packed"
CORE_ALGOS = "verl/trainer/ppo/core_algos.py"
#: the policy losses' ratio (compute_policy_loss_vanilla's among them)
VANILLA = ("    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)\n"
           "    ratio = torch.exp(negative_approx_kl)\n")


@pytest.fixture(scope="module")
def verl_clone(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    repo = tmp_path_factory.mktemp("verl")
    scaled = VANILLA.replace("torch.exp(negative_approx_kl)", "torch.exp(negative_approx_kl) * 1.01")
    return repo, planted_history("verl", repo, "verl", CORE_ALGOS, VANILLA, scaled,
                                 "ppo: fold the loss scale into the ratio")


SCENARIO = """
matrix:
  - model: tiny-qwen3
    device: cpu
    strategy: verl_fsdp
    layout: {dp: 2}
    timeout: 300
    workload: {batch_size: 4, prompt_len: 16, response_len: 16, steps: 2, loss: grpo}
    actor_rollout_ref:
      model: {use_remove_padding: true, enable_gradient_checkpointing: false,
              override_config: {attn_implementation: sdpa}}
      actor: {strategy: fsdp2, ppo_micro_batch_size_per_gpu: 1, fsdp_config: {use_torch_compile: false}}
"""


def test_verls_history_is_bisected_to_the_commit_that_broke_a_row(verl_clone, tmp_path, cache_dir):
    repo, commits = verl_clone
    scenario = tmp_path / "verl_row.yaml"
    scenario.write_text(SCENARIO)
    done = run_cli("bisect", str(scenario), "-k", ROW, "--project", "verl", "--repo", str(repo), "--good",
                   commits["good"], "--bad", commits["bad"], "--out", str(tmp_path / "out"),
                   "--cache-dir", str(cache_dir), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    [answer] = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert answer["first_bad"] == commits["regression"], answer
    assert {t["commit"]: t["verdict"] for t in answer["trials"]} == {commits["regression"]: "FAIL",
                                                                     commits["readme"]: "PASS"}, answer
