"""Element accesses of per-thread code that are one aligned run of a tile: ``S[e // C, e % C]``
with ``e = base + t * J + j`` inside a loop over (t, j) — TileLang's per-thread dequantization
loads a thread's packed bytes and stores its decoded values this way.

Where the loop's iterations, in row-major loop order, touch consecutive row-major elements of
the tile starting at ``base`` (uniform over the loop, a multiple of the loop's size), the access
is the whole chunk ``base // size`` of the tile viewed as ``[chunks, size]``: one tensor of the
loop's shape. The ``tl`` backend places a store's values there (``triton_ext/tl/scatter.py``);
``legalize_wgmma`` lets such shared accesses onto the Gluon path, whose emitter loads and stores
the chunk as a row slice of the shared tile (at a compile-time row). Both ask ``chunk_start``.
"""
from __future__ import annotations

import math
from typing import Optional

from . import ir
from .simplify import linear
from .traverse import subexprs


def flat_offset(shape: tuple[int, ...], indices) -> ir.Expr:
    """The row-major offset of ``[indices]`` in a tile of ``shape`` (``(e // C, e % C)`` into
    ``[R, C]`` is e)."""
    if (len(indices) == 2 and all(isinstance(i, ir.BinOp) for i in indices)
            and (indices[0].op, indices[1].op) == (ir.BinOpKind.FLOORDIV, ir.BinOpKind.MOD)
            and indices[0].a == indices[1].a and ir.as_int(indices[0].b) == ir.as_int(indices[1].b) == shape[1]):
        return indices[0].a
    flat: Optional[ir.Expr] = None
    for i, stride in zip(indices, [math.prod(shape[d + 1:]) for d in range(len(shape))]):
        term = ir.BinOp(ir.BinOpKind.MUL, i, ir.Const(stride, ir.DType.I32), ir.DType.I32)
        flat = term if flat is None else ir.BinOp(ir.BinOpKind.ADD, flat, term, ir.DType.I32)
    return flat


def chunk_start(shape: tuple[int, ...], indices, loop_vars, extents) -> Optional[ir.Expr]:
    """Where the iterations of a loop over ``loop_vars`` (of ``extents``) access ``[indices]`` of a
    tile of ``shape`` as one aligned run in loop order: the run's first element (an expression
    free of the loop's variables, a multiple of the loop's size). None for any other access."""
    terms = linear(flat_offset(shape, indices))
    size = math.prod(extents)
    if terms is None or math.prod(shape) % size:
        return None
    strides = [math.prod(extents[k + 1:]) for k in range(len(extents))]
    if any(terms.get(v, 0) != st for v, st in zip(loop_vars, strides)):
        return None
    base = {t: c for t, c in terms.items() if t not in loop_vars}
    if any(c % size for c in base.values()) or any(
            t is not None and any(x in loop_vars for x in subexprs(t)) for t in base):
        return None
    start: ir.Expr = ir.Const(0, ir.DType.I32)
    for t, c in base.items():
        term = ir.Const(c, ir.DType.I32) if t is None else ir.BinOp(
            ir.BinOpKind.MUL, t, ir.Const(c, ir.DType.I32), ir.DType.I32)
        start = ir.BinOp(ir.BinOpKind.ADD, start, term, ir.DType.I32)
    return start
