"""The eager style's declarations: ``T.const`` (specialized dimensions) and ``T.empty`` (outputs).
Valid only in the body of an eager ``@tilews.jit`` function (``tilews.lowering.frontend.eager``)."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import eager


def const(names: str, dtype=ir.DType.I32):
    """``M, N = T.const("M, N")``: dimensions the kernel is specialized on (one compiled kernel
    per value), read from the call's tensors: from the first declared tensor that has the name as
    a whole dimension, else from a dimension ``scale * name + offset``; a keyword at the call
    gives it instead (``fn.compile(M=1024, ...)``). One name gives a value, several a tuple."""
    return eager.const(names, dtype)


def empty(*shape, dtype=ir.DType.F32):
    """``C = T.empty((M, N), dtype)`` (or ``T.empty(M, N, dtype=...)``): an output the call
    allocates; the function returns it."""
    return eager.empty(*shape, dtype=dtype)
