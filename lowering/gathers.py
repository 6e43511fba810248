"""Fragment reads that are gathers: one dim's index computed inside a ``T.Parallel``.

``legalize_wgmma`` accepts them on the Gluon path and the Gluon emitter spells them as
``gl.gather`` along that dim; both ask ``gathered_axis``.
"""
from __future__ import annotations

from typing import Optional

from . import ir


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
