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

An element atomic add into an on-chip buffer inside ``T.Parallel`` (``S[L[i]] += v`` in per-thread
code) is a scatter-add: each element gains the sum of what the iterations adding to it add, summed
in float32 (int32) at least and rounded once. The masked-off iterations' values are zeroed, the
loop axes no index reads are summed away, the rest laid out in the buffer's dim order (as 3), and
along each dim whose index is not the loop variable over the whole dim, the sum over the
iterations whose index is each element (a one-hot of dim x loop extent); the dims indexed by no
variable select with a one-hot.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.traverse import subexprs

from ..pysource import nonneg
from .context import TL_DTYPE, Ctx, arange, shape_text
from .exprs import one_hot, spell, value_as


def scatter(ctx: Ctx, s: ir.Store) -> None:
    b, par = s.buffer, ctx.par
    readers = _readers(ctx, b, s.indices, s.loc)
    cur, rank = list(par.shape), len(par.shape)
    value, hit = ctx.fresh(f"{b.name}_value"), ctx.fresh(f"{b.name}_hit")
    ctx.line(f"{value} = tl.broadcast_to({value_as(ctx, s.value, b.dtype)}, {shape_text(cur)})")
    conds = _conds(ctx, b, s.indices)
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
    shape = _in_dim_order(ctx, (value, hit), readers, cur)     # 3
    full = ctx.shape(b)
    for d, (i, a) in enumerate(zip(s.indices, readers)):
        if _in_place(ctx, b, d, i, a):
            continue
        width, n = shape[d], full[d]
        shape[d] = n
        last = ctx.fresh("last")
        ctx.line(f"{last} = tl.max(tl.where({_writes(ctx, i, a, width, n)}, "
                 f"tl.arange(0, {width})[None, :], -1), axis=1)")
        along = f"tl.reshape({last}, {shape_text([n if k == d else 1 for k in range(len(shape))])})"
        index = f"tl.broadcast_to(tl.maximum({along}, 0), {shape_text(shape)})"
        ctx.line(f"{value} = tl.gather({value}, {index}, {d})")
        ctx.line(f"{hit} = tl.gather({hit}, {index}, {d}) * ({along} >= 0).to(tl.int32)")
    conds = [f"({hit} != 0)"]                                  # 4
    if any(a is None for a in readers):
        conds.append(one_hot(ctx, b, [i if a is None else None for i, a in zip(s.indices, readers)]))
    x = ctx.name(b.name)
    ctx.line(f"{x} = tl.where({' & '.join(conds)}, {value}, {x})")


def scatter_add(ctx: Ctx, s: ir.AtomicAdd) -> None:
    """``s.dst`` (an element of an on-chip buffer) += ``s.value`` in each iteration of the loop
    (once outside one)."""
    b, par, indices = s.dst.buffer, ctx.par, s.dst.starts
    wide = _summed_in(b.dtype)
    if par is None:                            # one add, of the block
        x, picked = ctx.name(b.name), one_hot(ctx, b, indices)
        ctx.line(f"{x} = tl.where({picked}, {_plus(ctx, b, wide, value_as(ctx, s.value, wide))}, {x})")
        return
    readers = _readers(ctx, b, indices, s.loc)
    cur, rank = list(par.shape), len(par.shape)
    value = ctx.fresh(f"{b.name}_add")
    ctx.line(f"{value} = tl.broadcast_to({value_as(ctx, s.value, wide)}, {shape_text(cur)})")
    conds = _conds(ctx, b, indices)
    if conds:
        ctx.line(f"{value} = tl.where({' & '.join(conds)}, {value}, 0)")
    for a in range(rank):                      # the axes no index reads
        if a not in readers and cur[a] != 1:
            ctx.line(f"{value} = tl.sum({value}, axis={a}, keep_dims=True)")
            cur[a] = 1
    shape = _in_dim_order(ctx, (value,), readers, cur)
    full = ctx.shape(b)
    for d, (i, a) in enumerate(zip(indices, readers)):
        if _in_place(ctx, b, d, i, a):
            continue
        width, n = shape[d], full[d]
        hit = f"tl.reshape({_writes(ctx, i, a, width, n)}, " \
              f"{shape_text(shape[:d] + [n, width] + shape[d + 1:])})"
        ctx.line(f"{value} = tl.sum(tl.where({hit}, tl.expand_dims({value}, {d}), 0), axis={d + 1})")
        shape[d] = n
    if any(a is None for a in readers):
        picked = one_hot(ctx, b, [i if a is None else None for i, a in zip(indices, readers)])
        ctx.line(f"{value} = tl.where({picked}, {value}, 0)")
    ctx.line(f"{ctx.name(b.name)} = {_plus(ctx, b, wide, value)}")


def _plus(ctx: Ctx, b: ir.Buffer, wide: ir.DType, value: str) -> str:
    """``b``'s register tensor plus ``value`` (of dtype ``wide``), added in ``wide``."""
    x = ctx.name(b.name)
    if wide == b.dtype:
        return f"{x} + {value}"
    return f"({x}.to({TL_DTYPE[wide]}) + {value}).to({TL_DTYPE[b.dtype]})"


def _summed_in(dt: ir.DType) -> ir.DType:
    """The dtype a scatter-add into ``dt`` sums in: 32 bits at least."""
    if dt.bits >= 32 or dt is ir.DType.BOOL:
        return dt
    return ir.DType.F32 if dt.is_float else ir.DType.I32


def _conds(ctx: Ctx, b: ir.Buffer, indices) -> list[str]:
    """The iterations that reach an element: the enclosing masks, the indices inside ``b``."""
    conds = [ctx.par.mask()] if ctx.par.mask() else []
    for i, n in zip(indices, b.static_shape):
        t = spell(ctx, i)
        if not nonneg(ctx, i):
            conds.append(f"({t} >= 0)")
        if not (t.isdigit() and int(t) < n):
            conds.append(f"({t} < {n})")
    return conds


def _in_dim_order(ctx: Ctx, tensors, readers: list, cur: list[int]) -> list[int]:
    """Reshape ``tensors`` (of the loop's shape ``cur``, unit along the axes no index reads) to
    one dim per buffer dim, in the buffer's dim order; returns that shape."""
    used = sorted(a for a in readers if a is not None)
    order = [a for a in readers if a is not None]
    shape = [cur[a] if a is not None else 1 for a in readers]
    if order != used or cur != shape:
        for x in tensors:
            y = f"tl.reshape({x}, {shape_text([cur[a] for a in used] or [1])})"
            if order != used:
                y = f"tl.permute({y}, {shape_text([used.index(a) for a in order])})"
            ctx.line(f"{x} = tl.reshape({y}, {shape_text(shape)})")
    return shape


def _in_place(ctx: Ctx, b: ir.Buffer, d: int, index: ir.Expr, axis) -> bool:
    """Dim ``d`` needs no moving: no variable indexes it, or the loop variable over its extent."""
    par = ctx.par
    return axis is None or index == par.vars[axis] and par.extents[axis] == b.static_shape[d]


def _writes(ctx: Ctx, index: ir.Expr, axis: int, width: int, n: int) -> str:
    """A (n, width) mask: iteration w along loop ``axis`` (of ``width`` lanes) indexes element j
    of a dim of ``n`` (padded) elements."""
    rank = len(ctx.par.shape)
    lanes = ctx.fresh("lanes")
    single = [width if k == axis else 1 for k in range(rank)]
    ctx.line(f"{lanes} = tl.reshape(tl.broadcast_to({spell(ctx, index)}, {shape_text(single)}), "
             f"({width},))")
    return f"(({lanes}[None, :] == tl.arange(0, {n})[:, None]) & " \
           f"(tl.arange(0, {width})[None, :] < {ctx.par.extents[axis]}))"


def _readers(ctx: Ctx, b: ir.Buffer, indices, loc: ir.Loc) -> list:
    """For each dim of the buffer, the loop axis its index reads (None: none)."""
    readers = []
    for i in indices:
        axes = {ctx.par.vars.index(x) for x in subexprs(i) if x in ctx.par.vars}
        if len(axes) > 1 or axes & set(readers):
            raise ctx.unsupported(f"this access to on-chip buffer '{b.name}' inside "
                                  f"T.Parallel", loc,
                                  "inside T.Parallel, index each dim of an on-chip buffer you "
                                  "store or add to by an expression of at most one parallel "
                                  "variable, each variable in at most one dim")
        readers.append(axes.pop() if axes else None)
    return readers
