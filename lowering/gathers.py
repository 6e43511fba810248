"""Fragment reads that are gathers: one dim's index computed inside a ``T.Parallel``; and the
columns of per-thread locals that per-thread code over the thread dim alone reads and writes.

``legalize_wgmma`` accepts them on the Gluon path and the Gluon emitter spells them (``gl.gather``
along that dim; a column selected from, or merged into, the thread's row); both ask
``gathered_axis`` and ``per_thread_column``.
"""
from __future__ import annotations

from typing import Optional

from . import ir
from .traverse import subexprs


def gathered_axis(x: ir.Load, loop_vars: tuple, extents: tuple) -> Optional[int]:
    """The one dim of a fragment read inside a ``T.Parallel`` over ``loop_vars`` whose index is computed (``B_local[i, j // 2]``)
    while every other dim is indexed by the loop variable in its place over the same extent: a
    gather along that dim (the emitter's ``gl.gather``). None for any other read."""
    b = x.buffer
    if len(x.indices) != len(loop_vars) or len(loop_vars) > 2:
        return None
    computed = [d for d, (i, v) in enumerate(zip(x.indices, loop_vars)) if i != v]
    if len(computed) != 1 or not x.indices[computed[0]].dtype.is_int:
        return None
    same = all(b.static_shape[d] == extents[d] for d in range(len(loop_vars)) if d != computed[0])
    return computed[0] if same else None


def per_thread_column(b: ir.Buffer, indices, loop_vars: tuple, extents: tuple) -> Optional[ir.Expr]:
    """The column of a 2-d fragment ``b`` (a per-thread local: a row per thread) that
    ``b[indices]`` reads or writes inside per-thread code over the thread dim alone
    (``B_local[tx, 3]``: a call's unrolled code), an index free of the loop's variable; None
    for any other access."""
    if len(loop_vars) != 1 or len(indices) != 2 or b.scope is not ir.Scope.FRAGMENT \
            or indices[0] != loop_vars[0] or b.static_shape[0] != extents[0]:
        return None
    return None if loop_vars[0] in subexprs(indices[1]) else indices[1]
