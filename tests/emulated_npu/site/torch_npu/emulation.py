"""Per-process call counters of the emulated torch_npu ops (the harness records them per run).

Also the one place that says how the emulation refuses: every unimplemented argument combination raises
`EmulationRefused` (a NotImplementedError) naming the op and the argument.
"""
import functools
from collections import Counter

EMULATED = True

_COUNTS = Counter()


class EmulationRefused(NotImplementedError):
    """The emulated torch_npu does not implement this op / argument combination (it would be a guess)."""


def refuse(op, what):
    raise EmulationRefused(f"emulated torch_npu.{op}: {what} is not implemented by the CPU emulation "
                           f"(tests/emulated_npu/site/torch_npu); it refuses rather than guess")


def note(key):
    """Count one call of a variant (`npu_fusion_attention[TND, sparse_mode=2]`) beside the op's own count."""
    _COUNTS[key] += 1


def call_counts():
    """{op name: number of calls in this process} for every emulated op called at least once."""
    return dict(_COUNTS)


def reset_counts():
    _COUNTS.clear()


def counted(name):
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            _COUNTS[name] += 1
            return fn(*args, **kwargs)
        return inner
    return wrap
