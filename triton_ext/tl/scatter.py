"""Stores into an on-chip buffer inside ``T.Parallel`` at indices that are not the loop's variables
over the buffer's whole extent: ``buf[i // 2, j] = v``, ``sinks[i] = Sinks[by]`` over a loop of
another extent, ``S[h, k] = v`` at a runtime ``k``, each possibly under an ``if``.

Triton has no scatter into a register tensor, so the store is turned around: for each element of
the buffer, the iteration that writes it. Each dim of the buffer is indexed by an expression of at
most one parallel variable (each variable indexing at most one dim), or of none:

1. the value and the store's mask (the enclosing ``if``s, the iterations that exist, the indices
   inside the buffer) as tensors over the loop;
2. along each loop axis no index reads, the last iteration whose mask is set (``tl.max``), its
   value gathered (all of them store to the same elements);
3. the remaining axes laid out in the buffer's dim order; along each, for each element of the dim,
   the last iteration whose index is that element (a one-hot of dim x loop extent), its value and
   mask gathered;
4. the buffer replaced where that mask is set and the dims indexed by no variable select.

Where several iterations store to one element, the last in loop order wins (the interpreter's
order); the program's result is then the one its loop order gives.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.traverse import subexprs

from ..pysource import nonneg
from .context import Ctx, arange, shape_text
from .exprs import one_hot, spell, value_as


def scatter(ctx: Ctx, s: ir.Store) -> None:
    b, par = s.buffer, ctx.par
    readers = _readers(ctx, s)
    cur, rank = list(par.shape), len(par.shape)
    value, hit = ctx.fresh(f"{b.name}_value"), ctx.fresh(f"{b.name}_hit")
    ctx.line(f"{value} = tl.broadcast_to({value_as(ctx, s.value, b.dtype)}, {shape_text(cur)})")
    conds = [par.mask()] if par.mask() else []
    for i, n in zip(s.indices, b.static_shape):
        t = spell(ctx, i)
        if not nonneg(ctx, i):
            conds.append(f"({t} >= 0)")
        if not (t.isdigit() and int(t) < n):
            conds.append(f"({t} < {n})")
    ctx.line(f"{hit} = tl.full({shape_text(cur)}, 1, tl.int32)")
    if conds:
        ctx.line(f"{hit} = tl.where({' & '.join(conds)}, {hit}, 0)")
    for a in range(rank):                      # 2: axes no index reads
        if a in readers or cur[a] == 1:
            continue
        last = ctx.fresh("last")
        ctx.line(f"{last} = tl.max(tl.where({hit} != 0, {arange(cur[a], a, rank)}, -1), axis={a}, "
                 f"keep_dims=True)")
        ctx.line(f"{value} = tl.gather({value}, tl.maximum({last}, 0), {a})")
        ctx.line(f"{hit} = ({last} >= 0).to(tl.int32)")
        cur[a] = 1
    used = sorted(a for a in readers if a is not None)      # 3: into the buffer's dim order
    order = [a for a in readers if a is not None]
    shape = [cur[a] if a is not None else 1 for a in readers]
    if order != used or cur != shape:
        for x in (value, hit):
            y = f"tl.reshape({x}, {shape_text([cur[a] for a in used] or [1])})"
            if order != used:
                y = f"tl.permute({y}, {shape_text([used.index(a) for a in order])})"
            ctx.line(f"{x} = tl.reshape({y}, {shape_text(shape)})")
    full = ctx.shape(b)
    for d, (i, a) in enumerate(zip(s.indices, readers)):
        if a is None or i == par.vars[a] and par.extents[a] == b.static_shape[d]:
            continue                                           # (in place already)
        width, n = shape[d], full[d]
        shape[d] = n
        lanes = ctx.fresh("lanes")
        single = [width if k == a else 1 for k in range(rank)]
        ctx.line(f"{lanes} = tl.reshape(tl.broadcast_to({spell(ctx, i)}, {shape_text(single)}), "
                 f"({width},))")
        writes = f"({lanes}[None, :] == tl.arange(0, {n})[:, None]) & " \
                 f"(tl.arange(0, {width})[None, :] < {par.extents[a]})"
        last = ctx.fresh("last")
        ctx.line(f"{last} = tl.max(tl.where({writes}, tl.arange(0, {width})[None, :], -1), axis=1)")
        along = f"tl.reshape({last}, {shape_text([n if k == d else 1 for k in range(len(shape))])})"
        index = f"tl.broadcast_to(tl.maximum({along}, 0), {shape_text(shape)})"
        ctx.line(f"{value} = tl.gather({value}, {index}, {d})")
        ctx.line(f"{hit} = tl.gather({hit}, {index}, {d}) * ({along} >= 0).to(tl.int32)")
    conds = [f"({hit} != 0)"]                                  # 4
    if any(a is None for a in readers):
        conds.append(one_hot(ctx, b, [i if a is None else None for i, a in zip(s.indices, readers)]))
    x = ctx.name(b.name)
    ctx.line(f"{x} = tl.where({' & '.join(conds)}, {value}, {x})")


def _readers(ctx: Ctx, s: ir.Store) -> list:
    """For each dim of the buffer, the loop axis its index reads (None: none)."""
    readers = []
    for i in s.indices:
        axes = {ctx.par.vars.index(x) for x in subexprs(i) if x in ctx.par.vars}
        if len(axes) > 1 or axes & set(readers):
            raise ctx.unsupported(f"this store into on-chip buffer '{s.buffer.name}' inside "
                                  f"T.Parallel", s.loc,
                                  "inside T.Parallel, index each dim of an on-chip buffer you "
                                  "store to by an expression of at most one parallel variable, "
                                  "each variable in at most one dim")
        readers.append(axes.pop() if axes else None)
    return readers
