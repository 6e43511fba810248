"""Stores into an on-chip buffer inside ``T.Parallel`` at indices that are not the loop's variables
over the buffer's whole extent: ``buf[i // 2, j] = v``, ``sinks[i] = Sinks[by]`` over a loop of
another extent, ``S[h, k] = v`` at a runtime ``k``, each possibly under an ``if``.

Triton has no scatter into a register tensor, so the store is turned around: for each element of
the buffer, the iteration that writes it. Where each dim of the buffer is indexed by an expression
of at most one parallel variable (each variable indexing at most one dim), or of none:

1. the value and the store's mask (the enclosing ``if``s, the iterations that exist, the indices
   inside the buffer) as tensors over the loop;
2. along each loop axis no index reads, the last iteration whose mask is set (``tl.max``), its
   value gathered (all of them store to the same elements);
3. the remaining axes laid out in the buffer's dim order; along each, for each element of the dim,
   the last iteration whose index is that element (a one-hot of dim x loop extent), its value and
   mask gathered;
4. the buffer replaced where that mask is set and the dims indexed by no variable select.

Otherwise (``S[ty * 32 + tx]`` in per-thread code of two thread dims) over the flat iterations: where
the iterations write one aligned run of the buffer in row-major order (``S[e // C, e % C]`` with
``e = base + t * J + j``), the loop's values reshaped into that chunk; else, for each element, the
last iteration whose flat offset into the buffer is that element (a one-hot of buffer size x
iteration count).

Where several iterations store to one element, the last in loop order wins (the interpreter's
order); the program's result is then the one its loop order gives.

An element atomic add into an on-chip buffer inside ``T.Parallel`` (``S[L[i]] += v`` in per-thread
code) is a scatter-add: each element gains the sum of what the iterations adding to it add, summed
in float32 (int32) at least and rounded once. The masked-off iterations' values are zeroed, the
loop axes no index reads are summed away, the rest laid out in the buffer's dim order (as 3), and
along each dim whose index is not the loop variable over the whole dim, the sum over the
iterations whose index is each element (a one-hot of dim x loop extent); the dims indexed by no
variable select with a one-hot. Where an index reads several variables, over the flat iterations
as a store.
"""
from __future__ import annotations

import math
from typing import Optional

from tilews.lowering import ir
from tilews.lowering.chunks import chunk_start
from tilews.lowering.traverse import subexprs

from ..pysource import atom, nonneg
from .context import TL_DTYPE, Ctx, arange, shape_text
from .exprs import one_hot, spell, value_as


def last_where(mask: str, index: str, axis: int, keep_dims: bool = False) -> str:
    """Along ``axis``, the largest ``index`` (the last iteration in loop order) where ``mask``
    holds, -1 where it holds nowhere: the one rule for which of several stores to an element
    wins."""
    keep = ", keep_dims=True" if keep_dims else ""
    return f"tl.max(tl.where({mask}, {index}, -1), axis={axis}{keep})"


def scatter(ctx: Ctx, s: ir.Store) -> None:
    b, par = s.buffer, ctx.par
    readers = _readers(ctx, s.indices)
    cur, rank = list(par.shape), len(par.shape)
    value, hit = ctx.fresh(f"{b.name}_value"), ctx.fresh(f"{b.name}_hit")
    ctx.line(f"{value} = tl.broadcast_to({value_as(ctx, s.value, b.dtype)}, {shape_text(cur)})")
    conds = _conds(ctx, b, s.indices)
    ctx.line(f"{hit} = tl.full({shape_text(cur)}, 1, tl.int32)")
    if conds:
        ctx.line(f"{hit} = tl.where({' & '.join(conds)}, {hit}, 0)")
    if readers is None:
        if not _chunk_store(ctx, b, s.indices, value, hit):
            _flat_store(ctx, b, s.indices, value, hit)
        return
    for a in range(rank):                      # 2: axes no index reads
        if a in readers or cur[a] == 1:
            continue
        last = ctx.fresh("last")
        ctx.line(f"{last} = {last_where(f'{hit} != 0', arange(cur[a], a, rank), a, keep_dims=True)}")
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
        along_dim = f"tl.arange(0, {width})[None, :]"
        ctx.line(f"{last} = {last_where(_writes(ctx, i, a, width, n), along_dim, 1)}")
        along = f"tl.reshape({last}, {shape_text([n if k == d else 1 for k in range(len(shape))])})"
        index = f"tl.broadcast_to(tl.maximum({along}, 0), {shape_text(shape)})"
        ctx.line(f"{value} = tl.gather({value}, {index}, {d})")
        ctx.line(f"{hit} = tl.gather({hit}, {index}, {d}) * ({along} >= 0).to(tl.int32)")
    conds = [f"({hit} != 0)"]                                  # 4
    if any(a is None for a in readers):
        conds.append(one_hot(ctx, b, [i if a is None else None for i, a in zip(s.indices, readers)]))
    x = ctx.name(b.name)
    ctx.line(f"{x} = tl.where({' & '.join(conds)}, {value}, {x})")


def _chunk_store(ctx: Ctx, b: ir.Buffer, indices, value: str, hit: str) -> bool:
    """A store whose iterations, in loop order, write one aligned run of ``b``'s elements in
    row-major order (``lowering/chunks.py``: TileLang's per-thread dequantization into a shared
    tile): the run is the loop's values reshaped, placed at chunk ``start / size`` of ``b``
    viewed as chunks (work of the buffer's size, not of a one-hot). False where the store is not
    of that form."""
    par = ctx.par
    shape = b.static_shape
    if tuple(par.shape) != tuple(par.extents) or tuple(ctx.shape(b)) != shape:
        return False
    start = chunk_start(shape, indices, par.vars, par.extents)
    if start is None:
        return False
    size = math.prod(par.extents)
    chunks, x = math.prod(shape) // size, ctx.name(b.name)
    chunk = ctx.fresh("chunk")
    ctx.line(f"{chunk} = {atom(spell(ctx, start))} // {size}")
    where = (f"(tl.arange(0, {chunks})[:, None] == {chunk}) & "
             f"(tl.reshape({hit}, (1, {size})) != 0)")
    ctx.line(f"{x} = tl.reshape(tl.where({where}, tl.reshape({value}, (1, {size})), "
             f"tl.reshape({x}, ({chunks}, {size}))), {shape_text(shape)})")
    return True


def _flat_store(ctx: Ctx, b: ir.Buffer, indices, value: str, hit: str) -> None:
    """Step 2-4 over the flat iterations, where an index reads several loop variables (or one
    variable indexes several dims: ``S[ty * 32 + tx]``): per element, the last iteration (in loop
    order) that stores to it."""
    flat, lanes, n = _flat(ctx, b, indices)
    last = ctx.fresh("last")
    writes = (f"({flat}[None, :] == tl.arange(0, {n})[:, None]) & "
              f"(tl.reshape({hit}, ({lanes},))[None, :] != 0)")
    ctx.line(f"{last} = {last_where(writes, f'tl.arange(0, {lanes})[None, :]', 1)}")
    ctx.line(f"{value} = tl.gather(tl.reshape({value}, ({lanes},)), tl.maximum({last}, 0), 0)")
    shape = shape_text(ctx.shape(b))
    x = ctx.name(b.name)
    ctx.line(f"{x} = tl.where(tl.reshape({last} >= 0, {shape}), tl.reshape({value}, {shape}), {x})")


def scatter_add(ctx: Ctx, s: ir.AtomicAdd) -> None:
    """``s.dst`` (an element of an on-chip buffer) += ``s.value`` in each iteration of the loop
    (once outside one)."""
    b, par, indices = s.dst.buffer, ctx.par, s.dst.starts
    wide = _summed_in(b.dtype)
    if par is None:                            # one add, of the block
        x, picked = ctx.name(b.name), one_hot(ctx, b, indices)
        ctx.line(f"{x} = tl.where({picked}, {_plus(ctx, b, wide, value_as(ctx, s.value, wide))}, {x})")
        return
    readers = _readers(ctx, indices)
    cur, rank = list(par.shape), len(par.shape)
    value = ctx.fresh(f"{b.name}_add")
    ctx.line(f"{value} = tl.broadcast_to({value_as(ctx, s.value, wide)}, {shape_text(cur)})")
    conds = _conds(ctx, b, indices)
    if conds:
        ctx.line(f"{value} = tl.where({' & '.join(conds)}, {value}, 0)")
    if readers is None:                        # S[ty * 32 + tx]: over the flat iterations
        flat, lanes, n = _flat(ctx, b, indices)
        ctx.line(f"{value} = tl.sum(tl.where({flat}[None, :] == tl.arange(0, {n})[:, None], "
                 f"tl.reshape({value}, ({lanes},))[None, :], 0), axis=1)")
        ctx.line(f"{ctx.name(b.name)} = {_plus(ctx, b, wide, f'tl.reshape({value}, {shape_text(ctx.shape(b))})')}")
        return
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
    return ctx.to(f"({x}.to({TL_DTYPE[wide]}) + {value})", b.dtype)


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


def _readers(ctx: Ctx, indices) -> Optional[list]:
    """For each dim of the buffer, the loop axis its index reads (None: none); None where an index
    reads several, or a variable indexes several dims."""
    readers = []
    for i in indices:
        axes = {ctx.par.vars.index(x) for x in subexprs(i) if x in ctx.par.vars}
        if len(axes) > 1 or axes & set(readers):
            return None
        readers.append(axes.pop() if axes else None)
    return readers


def _flat(ctx: Ctx, b: ir.Buffer, indices) -> tuple[str, int, int]:
    """Each iteration's flat offset into ``b``'s register tensor, as a tensor of the loop's
    iterations in loop order; and the numbers of iterations and of elements."""
    shape, lanes = ctx.shape(b), math.prod(ctx.par.shape)
    terms = []
    for d, i in enumerate(indices):
        stride = math.prod(shape[d + 1:])
        terms.append(spell(ctx, i) if stride == 1 else f"{atom(spell(ctx, i))} * {stride}")
    flat = ctx.fresh(f"{b.name}_at")
    ctx.line(f"{flat} = tl.reshape(tl.broadcast_to({' + '.join(terms)}, "
             f"{shape_text(ctx.par.shape)}), ({lanes},))")
    return flat, lanes, math.prod(shape)
