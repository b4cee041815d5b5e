"""Rollout ↔ trainer parity: an inference engine (vLLM) against every trainer, and the weight sync between them."""
