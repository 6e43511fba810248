"""Fills, math on scalars and elements, casts, atomics."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import cross_thread, hints, semantic
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
ceil = _math(ir.MathFn.CEIL)


def clamp(x, lo, hi):
    """``min(max(x, lo), hi)``."""
    return min(max(x, lo), hi)


def floordiv(a, b):
    """``a // b``, rounded toward negative infinity (Python's and TileLang's floor division)."""
    return a // b


def floormod(a, b):
    """``a % b`` with the sign of ``b`` (the remainder of ``floordiv``)."""
    return a % b


def shift_left(a, b):
    """``a << b``."""
    return a << b


def cast(value, dtype):
    """``value`` converted to ``dtype``; a Python number becomes a constant of that dtype."""
    return semantic.cast(value, dtype)


def Cast(dtype, value):  # noqa: N802  (TileLang's spelling)
    """``T.cast(value, dtype)`` with TileLang's argument order."""
    return semantic.cast(value, dtype)


def reinterpret(value, dtype):
    """``value``'s bits read as ``dtype``, of the same width (``T.reinterpret(x, T.uint32)`` of a
    float32 ``x``); ``T.cast`` converts the value instead."""
    if isinstance(value, str):
        raise semantic.err(f"T.reinterpret(value, dtype) takes the value first, got the dtype "
                           f"{value!r} (TVM's tirx.reinterpret takes the dtype first)")
    if dtype == "handle":       # TVM's null handle, which T.attr's reduce scope takes
        return cross_thread.null_handle(value)
    return semantic.bitcast(value, dtype)


def if_then_else(cond, a, b):
    return semantic.select(cond, a, b)


def infinity(dtype):
    return semantic.infinity(dtype)


# TileLang's C++ memory orders -> the orders tilews spells (ir.MEMORY_ORDERS): "consume" is an
# acquire, and "seq_cst" an acq_rel (Triton has nothing stronger; one atomic per block orders
# the same way under both)
_MEMORY_ORDERS = {None: "relaxed", "relaxed": "relaxed", "consume": "acquire", "acquire": "acquire",
                  "release": "release", "acq_rel": "acq_rel", "seq_cst": "acq_rel"}


def atomic_add(dst, value, memory_order=None, return_prev=False, use_tma=False):
    """``dst += value`` atomically in global memory (an element, or a tile from a buffer).

    An element add outside ``T.Parallel`` is one add per block (as every statement there), and
    ``return_prev=True`` (that form only) returns the value ``dst`` held before it, the same for
    every thread. ``memory_order`` orders the block's other global accesses around the add, at
    device scope: ``"release"`` makes everything the block wrote before it visible to a block
    that reads this add's result with ``"acquire"`` (then its later reads see those writes);
    ``"acq_rel"`` is both, ``"relaxed"`` (the default) neither. The last-arriving-block pattern::

        T.copy(partial, W[...])                       # this block's share
        n = T.atomic_add(Arrivals[tile], 1, memory_order="acq_rel", return_prev=True)
        if n == parts - 1:                            # every other share is visible here
            ...                                       # read W, finish the tile

    ``use_tma`` (TileLang's request for a bulk reduce-add of a tile) is a hint: tilews chooses how
    the add is done, so it is recorded in the report's notes and changes no result.
    """
    if memory_order not in _MEMORY_ORDERS:
        raise semantic.err(f"T.atomic_add(memory_order={memory_order!r}): must be one of "
                           f"{', '.join(repr(o) for o in list(_MEMORY_ORDERS)[1:])}")
    if use_tma:
        hints.note("T.atomic_add(use_tma=True): a hint; tilews chooses how the add is done")
    return semantic.atomic_add(dst, value, _MEMORY_ORDERS[memory_order], bool(return_prev))
