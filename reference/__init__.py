"""The reference's own math: the HF fp32 reference (the `hf` engine, engines/specs.py HF) computes its log-probs,
entropy, RL step (advantages, policy losses, KL loss, aggregation), optimizer and learning-rate schedule here, and
nowhere else. No candidate engine imports this package and nothing here imports a candidate's loss, optimizer or
schedule code (harness/contract/losses.py, engines/training.py's optimizer, harness/contract/schedule.py) or verl:
a bug in either side then shows as a difference instead of passing on both. Written from the papers' and verl's
documented math (verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py, Loshchilov & Hutter's AdamW) and
cross-checked against a third source in tests/unit/test_reference_math.py (torch's cross-entropy and schedulers,
torch.optim, hand-derived numbers); tests/unit/test_reference_independence.py keeps the import graphs apart."""
