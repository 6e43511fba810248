"""Fills, math on scalars and elements, casts, atomics."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import semantic
from tilews.lowering.frontend.values import ceildiv  # noqa: F401  (re-exported as T.ceildiv)


def fill(buffer, value):
    """Set every element of an on-chip buffer (or region) to ``value``."""
    semantic.fill(buffer, value)


def clear(buffer):
    """``T.fill(buffer, 0)``."""
    semantic.fill(buffer, 0)


def _math(fn: ir.MathFn):
    def op(*args):
        return semantic.math_call(fn, *args)
    op.__name__ = fn.value
    op.__doc__ = f"``{fn.value}`` of runtime values (or of Python numbers, at build time)."
    return op


exp = _math(ir.MathFn.EXP)
exp2 = _math(ir.MathFn.EXP2)
log = _math(ir.MathFn.LOG)
log2 = _math(ir.MathFn.LOG2)
max = _math(ir.MathFn.MAX)  # noqa: A001
min = _math(ir.MathFn.MIN)  # noqa: A001
abs = _math(ir.MathFn.ABS)  # noqa: A001
sqrt = _math(ir.MathFn.SQRT)
rsqrt = _math(ir.MathFn.RSQRT)


def cast(value, dtype):
    return semantic.cast(value, dtype)


def if_then_else(cond, a, b):
    return semantic.select(cond, a, b)


def infinity(dtype):
    return semantic.infinity(dtype)


def atomic_add(dst, value):
    """``dst += value`` atomically in global memory (an element, or a tile from a buffer)."""
    semantic.atomic_add(dst, value)
