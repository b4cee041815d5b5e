"""Count the torch_npu fused ops a run calls, so that a record shows which path actually ran (a MindSpeed run
whose attention silently fell back to plain torch would otherwise pass unnoticed).

The emulated torch_npu (tests/emulated_npu/site) counts its own ops (`torch_npu.emulation.call_counts()`); a real
torch_npu gets counting wrappers around the ops below, installed BEFORE MindSpeed is imported (MindSpeed calls
them as `torch_npu.<op>` attributes) and removed by `restore()`. Counts are per process (rank 0 records its own).
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from typing import Any

#: the fused ops MindSpeed's torch paths call (attention, norms, rope, swiglu, MoE permute / grouped matmul)
OPS = ("npu_fusion_attention", "npu_fusion_attention_grad", "npu_rms_norm", "npu_swiglu", "npu_rotary_mul",
       "npu_rotary_position_embedding", "npu_grouped_matmul", "npu_moe_token_permute", "npu_moe_token_unpermute",
       "npu_moe_token_permute_with_routing_map", "npu_moe_token_unpermute_with_routing_map")


#: the flash-attention ops, counted per variant as well: which input_layout and sparse_mode ran (TND with the
#: compressed causal mask is the packed path, sparse_mode 1 with a full mask the padded one)
ATTENTION_OPS = ("npu_fusion_attention", "npu_fusion_attention_grad")


def attention_variant(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """`npu_fusion_attention[TND, sparse_mode=2]`: input_layout is the 5th positional argument of both ops (the
    6th of the grad op, after dy), sparse_mode a keyword (default 0), as the emulation names them too."""
    position = 5 if name.endswith("_grad") else 4
    layout = args[position] if len(args) > position else kwargs.get("input_layout")
    return f"{name}[{layout}, sparse_mode={int(kwargs.get('sparse_mode', 0))}]"


class FusedOpCounter:
    """One per process: `install()` before MindSpeed imports, `reset()` at setup, `counts()` at the end."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._saved: dict[str, Any] = {}
        self._module: Any = None

    @property
    def emulated(self) -> bool:
        return getattr(getattr(self._module, "emulation", None), "EMULATED", False) is True

    def install(self) -> None:
        if self._module is not None:
            return
        self._module = importlib.import_module("torch_npu")
        if self.emulated:
            return
        for name in OPS:
            original = getattr(self._module, name, None)
            if original is not None:
                self._saved[name] = original
                setattr(self._module, name, self._wrap(name, original))

    def _wrap(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[name] += 1
            if name in ATTENTION_OPS:
                self._counts[attention_variant(name, args, kwargs)] += 1
            return fn(*args, **kwargs)

        return counted

    def reset(self) -> None:
        self._counts.clear()
        if self.emulated:
            self._module.emulation.reset_counts()

    def counts(self) -> dict[str, int]:
        if self.emulated:
            return dict(sorted(self._module.emulation.call_counts().items()))
        return dict(sorted(self._counts.items()))

    def restore(self) -> None:
        for name, original in self._saved.items():
            setattr(self._module, name, original)
        self._saved.clear()


COUNTER = FusedOpCounter()
