"""Stub torchair (Ascend graph-mode compiler) for the emulated torch_npu.

MindSpeed's op builders import it at module load and register GE graph converters with
`register_fx_node_ge_converter` (mindspeed/op_builder/gmm_builder.py, ffn_builder.py,
npu_mm_all_reduce_add_rms_norm_builder.py ...). Registration is a no-op here; anything that would build or compile a
graph (ge.custom_op, ge.Const, ge.Cast, ge.Fill, get_npu_backend, get_compiler ...) raises NotImplementedError.
"""
from . import ge  # noqa: F401 - torchair.ge is what MindSpeed imports

EMULATED = True


def register_fx_node_ge_converter(aten_op):
    def decorator(fn):
        return fn
    return decorator


def _refuse(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"stub torchair.{name}: graph compilation is not emulated on CPU")
    fn.__name__ = name
    return fn


get_npu_backend = _refuse("get_npu_backend")
get_compiler = _refuse("get_compiler")
CompilerConfig = _refuse("CompilerConfig")
