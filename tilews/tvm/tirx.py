"""``tvm.tirx`` as TileLang programs use it: building scalar expressions inside a kernel.

Each name is a tile-language operation with TVM's argument order: ``const(value, dtype)`` (a
typed constant, ``T.cast`` of a number), ``Cast(dtype, value)`` (``T.cast``),
``reinterpret(dtype, value)`` (``T.reinterpret(value, dtype)``: same-width bit-cast),
``Select(cond, a, b)`` (``T.if_then_else``), ``Min(a, b)`` (``T.min``). ``PrimExpr`` is the class of
a kernel's runtime scalar values (annotations, ``isinstance``). Any other name raises
``tilews.tvm.UnprovidedTVMName``.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import semantic
from tilews.lowering.frontend.values import Scalar as PrimExpr

from .unprovided import UnprovidedTVMName

__all__ = ["Cast", "Min", "PrimExpr", "Select", "const", "reinterpret"]


def const(value, dtype=None):
    """``value`` as a constant of ``dtype`` (by default the type Python's value implies)."""
    return semantic.cast(value, ir.const(value).dtype if dtype is None else dtype)


def Cast(dtype, value):  # noqa: N802  (TVM's spelling)
    return semantic.cast(value, dtype)


def reinterpret(dtype, value):
    return semantic.bitcast(value, dtype)


def Select(cond, a, b):  # noqa: N802
    return semantic.select(cond, a, b)


def Min(a, b):  # noqa: N802
    return semantic.math_call(ir.MathFn.MIN, a, b)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnprovidedTVMName("tvm.tirx", name, __all__)
