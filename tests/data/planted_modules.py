"""HF engines with one fault planted at a known module, each changing what that module computes in the forward (and
nothing upstream of it): the first divergent module a FAIL names must be that module (tests/multiproc/
test_first_divergent.py). `EXPECTED`: engine class name -> the canonical module it must name."""

from __future__ import annotations

import torch

from parity.engines.hf.engine import HFEngine


class _Planted(HFEngine):
    def plant(self, model: torch.nn.Module) -> None:
        raise NotImplementedError

    def setup(self) -> None:
        super().setup()
        with torch.no_grad():
            self.plant(self.model)


def _attention_core(layer: int, factor: float) -> type[_Planted]:
    class AttentionCore(_Planted):  # the softmax temperature of scaled-dot-product attention
        def plant(self, model: torch.nn.Module) -> None:
            model.model.layers[layer].self_attn.scaling *= factor
    return AttentionCore


class Rope(_Planted):  # every layer's rotary frequencies: the first attention is the first to see them
    def plant(self, model: torch.nn.Module) -> None:
        model.model.rotary_emb.inv_freq.mul_(1.03)


def _input_norm(layer: int) -> type[_Planted]:
    class InputNorm(_Planted):  # the norm inside the attention block's input: its output is the first changed
        def plant(self, model: torch.nn.Module) -> None:
            model.model.layers[layer].input_layernorm.variance_epsilon = 0.3
    return InputNorm


class PostAttentionNorm(_Planted):
    def plant(self, model: torch.nn.Module) -> None:
        model.model.layers[1].post_attention_layernorm.variance_epsilon = 0.3


class FinalNorm(_Planted):
    def plant(self, model: torch.nn.Module) -> None:
        model.model.norm.variance_epsilon = 0.3


def _mlp(layer: int) -> type[_Planted]:
    class Mlp(_Planted):  # GELU where the model has SiLU
        def plant(self, model: torch.nn.Module) -> None:
            model.model.layers[layer].mlp.act_fn = torch.nn.GELU()
    return Mlp


def _router(layer: int) -> type[_Planted]:
    class Router(_Planted):  # sharper routing logits: other weights for the same hidden states
        def plant(self, model: torch.nn.Module) -> None:
            model.model.layers[layer].mlp.gate.weight.mul_(1.5)
    return Router


class LmHead(_Planted):
    def plant(self, model: torch.nn.Module) -> None:
        model.lm_head.weight.mul_(1.02)


AttentionCore0, AttentionCore2 = _attention_core(0, 1.1), _attention_core(2, 0.9)
InputNorm1, InputNorm3 = _input_norm(1), _input_norm(3)
Mlp0, Mlp3 = _mlp(0), _mlp(3)
Router0, Router2 = _router(0), _router(2)

#: engine class -> (model, the module the FAIL must name); the CI set, one per kind of module plus a second norm
#: (every class above is a case: `ALL`)
ALL = {
    "AttentionCore0": ("tiny-llama", "layer0.attention"), "AttentionCore2": ("tiny-qwen3", "layer2.attention"),
    "Rope": ("tiny-llama", "layer0.attention"), "InputNorm1": ("tiny-llama", "layer1.attention"),
    "InputNorm3": ("tiny-qwen3", "layer3.attention"), "PostAttentionNorm": ("tiny-llama", "layer1.mlp"),
    "FinalNorm": ("tiny-qwen3", "final_norm"), "Mlp0": ("tiny-llama", "layer0.mlp"),
    "Mlp3": ("tiny-qwen3", "layer3.mlp"), "Router0": ("tiny-qwen3-moe", "layer0.router"),
    "Router2": ("tiny-qwen3-moe", "layer2.router"), "LmHead": ("tiny-llama", "lm_head"),
}
EXPECTED = {name: ALL[name] for name in ("AttentionCore2", "Rope", "InputNorm3", "PostAttentionNorm", "FinalNorm",
                                         "Mlp0", "Router2", "LmHead")}
