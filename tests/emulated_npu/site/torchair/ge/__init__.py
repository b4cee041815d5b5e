"""Stub torchair.ge: type names used in converter annotations; every graph-building call is refused."""


class Tensor:
    pass


class TensorSpec:
    pass


class _DataTypeMeta(type):
    def __getattr__(cls, name):
        if name.startswith("DT_"):
            return name
        raise AttributeError(name)


class DataType(metaclass=_DataTypeMeta):
    pass


def _refuse(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"stub torchair.ge.{name}: graph building is not emulated on CPU")
    fn.__name__ = name
    return fn


custom_op = _refuse("custom_op")
Const = _refuse("Const")
Cast = _refuse("Cast")
Fill = _refuse("Fill")


class attr:
    Int = staticmethod(_refuse("attr.Int"))
    Bool = staticmethod(_refuse("attr.Bool"))
    Float = staticmethod(_refuse("attr.Float"))
    Str = staticmethod(_refuse("attr.Str"))
    ListInt = staticmethod(_refuse("attr.ListInt"))
