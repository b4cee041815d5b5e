"""Imported once by the forkserver so that every forked rank starts with these modules loaded."""

import torch.distributed
import torch.distributed.fsdp  # noqa: F401
import transformers  # noqa: F401
from transformers import AutoModelForCausalLM  # noqa: F401

import engines.fsdp2
import engines.hf  # noqa: F401
import harness.worker  # noqa: F401
