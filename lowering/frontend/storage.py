"""Declared storage beyond tiles: ``T.alloc_var`` variables and ``T.alloc_global`` scratch.

A variable is a one-element ``LOCAL`` buffer the kernel body names (``values.VarRef``): every
backend already carries such scalars through loops and branches. A scratch buffer is a ``GLOBAL``
parameter of the kernel listed in ``ir.Kernel.scratch``, which the launcher allocates at each call
(``tilews.binding``) and no caller passes or receives.
"""
from __future__ import annotations

from typing import Optional

from .. import ir
from .context import builder
from .semantic import TensorSpec, alloc, err, store, tensor_param
from .values import BufferRef, NewVar, Scalar, as_dtype

VAR_SCOPES = ("local.var", "local")


def alloc_var(dtype, init, scope: str, name: Optional[str]) -> NewVar:
    """A scalar variable of ``dtype``, holding ``init`` (0 when not given: TileLang's default)
    from this statement on."""
    if scope not in VAR_SCOPES:
        raise err(f"T.alloc_var(scope={scope!r}): must be one of {', '.join(map(repr, VAR_SCOPES))}")
    var = NewVar(alloc((1,), dtype, ir.Scope.LOCAL, name).buffer)
    store(var, 0 if init is None else init)
    return var


def alloc_global(shape, dtype, name: Optional[str]) -> BufferRef:
    """A global buffer private to one launch: a kernel parameter the launcher allocates. Its
    sizes are ints or runtime dimensions of the tensor parameters (``T.dynamic``)."""
    shape = (shape,) if isinstance(shape, (int, Scalar)) else tuple(shape)
    for i, d in enumerate(shape):
        runtime_dim = isinstance(d, Scalar) and isinstance(d.expr, ir.Var) \
            and d.expr.kind is ir.VarKind.PARAM
        if not runtime_dim and not (isinstance(d, int) and not isinstance(d, bool) and d > 0):
            raise err(f"T.alloc_global: size {d!r} of dimension {i} must be a positive int or a "
                      f"runtime dimension of a tensor parameter (T.dynamic)")
    ref = tensor_param(name or "scratch", TensorSpec(shape, as_dtype(dtype)))
    builder().scratch.append(ref.buffer)
    return ref

