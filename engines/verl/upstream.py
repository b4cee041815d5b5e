"""Fingerprints of the verl functions the harness stands in for or bridges around, so that a stand-in cannot go
stale silently: when verl's source of one of them changes, tests/unit/test_verl_upstream.py FAILs naming the
function, and whoever updates the harness re-reads it and records the new fingerprint here.

A fingerprint is the sha256 of the function's syntax tree (`ast.dump`, without line numbers, comments or
formatting): a change in what the function does changes it, a reformatted comment does not. Read from source text,
verl-free and torch-free, in the installed verl and in the tree PARITY_VERL_SRC names.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class StandIn:
    path: str
    """The file inside verl's package (verl/...)."""
    qualname: str
    """Function or Class.method."""
    why: str
    """What the harness does in its place or around it (the shim or driver that depends on it)."""
    known: dict[str, str]
    """fingerprint -> the verl versions whose source has it."""

    @property
    def name(self) -> str:
        return f"{self.path}:{self.qualname}"


STAND_INS: tuple[StandIn, ...] = (
    StandIn("verl/workers/engine/megatron/utils.py", "set_random_seed",
            "shims.py MEGATRON_RNG_SEED seeds Megatron's RNG tracker on CPU where this function skips it",
            {"3bbdb4adce55ec29": "verl 0.9.1",
             "52d05ab48d849142": "verl main 1dda039b9"}),
    StandIn("verl/single_controller/base/decorator.py", "dispatch_nd_compute",
            "controller.py LocalWorkerGroup: each rank runs its own dp chunk (Ray puts the chunks in its object store "
            "and each actor gets one)",
            {"73cf477e8876ac2e": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/single_controller/base/decorator.py", "dispatch_lazy_compute_data_proto",
            "controller.py LocalWorkerGroup: the dp rank of each global rank, dp size = max + 1",
            {"a7fe9199abf1371d": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/single_controller/base/decorator.py", "collect_nd_compute",
            "controller.py LocalWorkerGroup: the collect ranks' outputs in global-rank order",
            {"845a91263938a287": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/trainer/ppo/ray_trainer.py", "RayPPOTrainer.fit",
            "engine.py VerlEngine._data / train_step: the lines of fit that prepare a step's batch (temperature, uid, "
            "global_token_num, token_level_rewards = scores) and the order of old log-prob, ref, advantage, update",
            {"440a3a49c2cf4b78": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/trainer/ppo/ray_trainer.py", "RayPPOTrainer._update_actor",
            "called unbound on controller.TrainerView (the attributes it reads)",
            {"340c4e2c93f07948": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/trainer/ppo/ray_trainer.py", "RayPPOTrainer._compute_old_log_prob",
            "called unbound on controller.TrainerView",
            {"128307564cbc8968": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/trainer/ppo/ray_trainer.py", "RayPPOTrainer._compute_ref_log_prob",
            "called unbound on controller.TrainerView",
            {"0e6abe608e0fb7da": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/trainer/ppo/v1/trainer_base.py", "PPOTrainer._update_actor",
            "verl's default (v1) trainer sets the meta keys of an update as RayPPOTrainer._update_actor, which the "
            "harness runs; a change here means the two may differ",
            {"cd7783aaa6ef6b14": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/workers/engine_workers.py", "ActorRolloutRefWorker.init_model",
            "engine.py trainer_config writes rollout.log_prob_* as the actor's (this asserts they agree on "
            "use_dynamic_bsz and takes the inference micro-batching from them); observe.py spies ppo_loss here",
            {"ccfec5589b8989bc": "verl 0.9.1 and main 1dda039b9"}),
    StandIn("verl/utils/megatron_utils.py", "load_megatron_model_to_gpu",
            "shims.py MODEL_ALREADY_ON_DEVICE skips it on verl's CPU platform",
            {"28d213e1c48dca5e": "verl 0.9.1",
             "c6aa23c4f1597616": "verl main 1dda039b9"}),
)
"""Filled by `python -m parity.engines.verl.upstream` (prints each fingerprint of the verl it finds)."""


def fingerprint(verl_root: Path, stand_in: StandIn) -> str | None:
    """The fingerprint of `stand_in` in the verl package at `verl_root` (the directory holding verl/), or None
    when the file or the function is gone."""
    file = verl_root / stand_in.path
    if not file.is_file():
        return None
    node: ast.AST | None = ast.parse(file.read_text())
    for part in stand_in.qualname.split("."):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]


def stale(verl_root: Path, stand_ins: tuple[StandIn, ...] = STAND_INS) -> list[str]:
    """One line per stand-in whose verl source at `verl_root` is not one the harness was written against."""
    problems = []
    for stand_in in stand_ins:
        found = fingerprint(verl_root, stand_in)
        if found is None:
            problems.append(f"{stand_in.name} is gone from the verl at {verl_root}: {stand_in.why}; re-read verl "
                            "and update the harness")
        elif found not in stand_in.known:
            problems.append(f"{stand_in.name} changed in the verl at {verl_root} (fingerprint {found}, known: "
                            f"{', '.join(f'{v} {k}' for k, v in stand_in.known.items()) or 'none'}): "
                            f"{stand_in.why}; re-read it, update the harness, then record the fingerprint in "
                            "engines/verl/upstream.py")
    return problems


def main() -> None:
    from parity.engines.verl import source

    root = source.package_dir()
    if root is None:
        raise SystemExit("verl is not importable here")
    print(f"verl {source.version()} at {root}")
    for stand_in in STAND_INS:
        print(f"  {fingerprint(root.parent, stand_in)}  {stand_in.name}")


if __name__ == "__main__":
    main()
