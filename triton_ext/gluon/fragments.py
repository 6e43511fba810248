"""Fragment math inside a role: ``T.Parallel`` over register tensors, reductions, fragment ->
fragment copies, and where each fragment's Python variable is first defined.

* A fragment is a register tensor in the layout ``infer_layouts`` chose, reassigned whole. It is
  declared (zeros) where its role starts unless it is *local*: every statement touching it lies in
  one statement list (the role's body or a loop's), and the first of them writes it whole without
  reading it (a fill, a copy into it, a clearing reduction, a ``T.Parallel`` storing it and not
  reading it). A local fragment is defined by that write, so a loop does not carry it (attention's
  S and P live one iteration, not the whole loop).
* A ``T.Parallel`` loop runs in the layout the plan's ``frames`` give it: each index is a
  ``gl.arange`` in the slice of that layout along its axis, expanded to the loop's rank, so every
  expression is a tensor broadcasting over the loop. A fragment indexed by all the indices is the
  tensor itself, a vector indexed by one of them is expanded along the other axis; each is
  converted to the layout its use needs when its own differs (``gl.convert_layout``). A store
  assigns the whole fragment (broadcast to the loop's shape, cast to its dtype, converted to its
  layout); under an ``if`` it keeps the old elements where the condition is false (``gl.where``).
  Per-thread code over the thread dim alone writes one column of a per-thread local by merging
  each thread's value into its row; per-thread code writing a run of a shared tile stores the
  run into its rows of the tile (``exprs.chunk_view``).
  A subexpression the stored value repeats (a Python variable of the user's program used several
  times) is computed once into a temporary, so a repeated global load is issued once.
* A reduction along a dim of a 2-d fragment is ``gl.max`` / ``gl.min`` / ``gl.sum`` (16-bit sums
  accumulate in f32), combined with the destination's elements when it does not clear it; Triton
  spells the cross-thread steps (warp shuffles, shared memory across warps).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tilews.lowering import ir
from tilews.lowering.errors import InternalError
from tilews.lowering.gathers import per_thread_column
from tilews.lowering.layouts import RowSlice
from tilews.lowering.traverse import buffers_read, buffers_written, exprs_of, subexprs, touched, walk

from ..pysource import atom
from .context import GL_DTYPE, Ctx
from .exprs import chunk_view, element_address, mask_arg, spell, temporaries, write_mask_arg


@dataclass
class Frame:
    """The ``T.Parallel`` being spelled."""
    vars: tuple[ir.Var, ...]
    extents: tuple[int, ...]
    layout: object
    const: str
    masks: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# where fragments are defined


def declare_fragments(ctx: Ctx, role: ir.Role) -> None:
    """Record the role's fragments and gemm operands kept alive by waits; declare the fragments
    that are not local (module docstring)."""
    used = [b for s in walk(role.body) for b in buffers_read(s) + buffers_written(s)
            if b.scope is ir.Scope.FRAGMENT]
    ctx.fragments = {b.name: b for b in used}
    gemms = [s for s in walk(role.body) if isinstance(s, ir.Gemm)]
    ctx.accumulators = list(dict.fromkeys(
        [s.c.buffer for s in gemms] + [s.a.buffer for s in gemms if s.a.buffer.scope is ir.Scope.FRAGMENT]))
    local = _local_fragments(role.body)
    ctx.defined = set()
    for b in dict.fromkeys(used):
        if b.name not in local:
            ctx.origin(b.loc)
            ctx.line(f"{ctx.name(b.name)} = gl.zeros({list(b.static_shape)}, {GL_DTYPE[b.dtype]}, "
                     f"layout={ctx.layout(b, b.loc)})")
            ctx.defined.add(b.name)


def _touched(s: ir.Stmt) -> set[str]:
    return {b.name for b in touched(s) if b.scope is ir.Scope.FRAGMENT}


def _local_fragments(body: ir.Seq) -> set[str]:
    """Fragments whose first touch in their innermost enclosing statement list defines them."""
    out: set[str] = set()
    per_stmt = [_touched(s) for s in body.stmts]
    for name in set().union(*per_stmt) if per_stmt else ():
        users = [s for s, t in zip(body.stmts, per_stmt) if name in t]
        if len(users) == 1 and isinstance(users[0], ir.For):
            continue                                  # decided inside the loop
        if _defines(users[0], name):
            out.add(name)
    for s in body.stmts:
        if isinstance(s, ir.For):
            inner = _local_fragments(s.body)
            out |= {n for n in inner if sum(n in t for t in per_stmt) == 1}
    return out


def _defines(s: ir.Stmt, name: str) -> bool:
    """Whether ``s`` writes fragment ``name`` whole without reading it first."""
    if isinstance(s, ir.Fill):
        return s.dst.buffer.name == name and s.dst.is_whole
    if isinstance(s, ir.Copy):
        return s.dst.buffer.name == name and s.src.buffer.name != name and s.dst.is_whole
    if isinstance(s, ir.Reduce):
        return s.dst.name == name and s.clear and s.src.name != name
    if isinstance(s, ir.Parallel):
        stores = [t for t in s.body.stmts if isinstance(t, ir.Store) and t.buffer.name == name
                  and tuple(t.indices) == s.vars]         # (a column store keeps the rest)
        reads = [x for t in walk(s.body) for x in _loads(t) if x.buffer.name == name]
        return bool(stores) and not reads
    return False


def _loads(s: ir.Stmt):
    return [x for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)]


# ----------------------------------------------------------------------------------------------
# T.Parallel


def parallel(ctx: Ctx, p: ir.Parallel, spell_body) -> None:
    layout = ctx.frames.get(p.vars[0].name)
    if layout is None:
        raise InternalError(f"gluon backend: the LayoutPlan has no frame for the T.Parallel over "
                            f"'{p.vars[0].name}'", p.loc)
    const = ctx.layout_const(layout)
    rank = len(p.vars)
    for k, (v, e) in enumerate(zip(p.vars, p.extents)):
        name = ctx.name(v.name)
        if rank == 1:
            ctx.line(f"{name} = gl.arange(0, {e}, layout={const})")
        else:
            along = ctx.layout_const(RowSlice(1 - k, layout), "axis_layout")
            ctx.line(f"{name} = gl.expand_dims(gl.arange(0, {e}, layout={along}), {1 - k})")
    ctx.nonneg.update(p.vars)
    ctx.par = Frame(p.vars, p.extents, layout, const)
    try:
        spell_body(ctx, p.body)
    finally:
        ctx.par = None


def masked(ctx: Ctx, s: ir.If, spell_body) -> None:
    """An ``if`` inside a ``T.Parallel``: the stores of each branch under its mask."""
    mask = ctx.fresh("mask")
    ctx.line(f"{mask} = {spell(ctx, s.cond)}")
    for body, m in ((s.then, mask), (s.orelse, f"({mask} == 0)")):
        ctx.par.masks.append(m)
        spell_body(ctx, body)
        ctx.par.masks.pop()


def store(ctx: Ctx, s: ir.Store) -> None:
    """``b[i, j] = value`` over the loop: the whole fragment reassigned, or global elements
    stored under their bounds (and the loop's masks)."""
    f, b = ctx.par, s.buffer
    x = ctx.name(b.name)
    value = _spell_once(ctx, s.value)
    used = set(f.vars) & {v for v in subexprs(s.value) if isinstance(v, ir.Var)}
    if len(used) < len(f.vars):
        # broadcast to the loop's shape: a scalar splat, a vector along one axis or a shared
        # element (a tensor of ones in each dimension) broadcast (not added to zeros: 0.0 + x
        # is no identity, so ptxas kept an FADD per element)
        full = f"gl.full({list(f.extents)}, {{}}, {GL_DTYPE[s.value.dtype]}, layout={f.const})"
        scalar = not used and not any(x.buffer.scope is ir.Scope.SHARED for x in _loads(s))
        value = full.format(value) if scalar else \
            f"gl.broadcast({atom(value)}, {full.format(0)})[0]"
    if b.scope is ir.Scope.GLOBAL:
        ptr, inside = element_address(ctx, b, s.indices, s.loc)
        mask = inside + f.masks
        ctx.line(f"gl.store({ptr}, {atom(value)}.to({GL_DTYPE[b.dtype]})"
                 f"{write_mask_arg(mask)})")
        return
    if s.value.dtype != b.dtype or _mixed(s.value, b.dtype):
        value = f"{atom(value)}.to({GL_DTYPE[b.dtype]})"
    if b.scope is ir.Scope.SHARED:          # per-thread code writing a run: its chunk
        desc, chunk = chunk_view(ctx, b, s.indices, s.loc)
        layout = ctx.layout_const(chunk.layout, "chunk_layout")
        ctx.line(f"{desc}.store(gl.convert_layout(gl.reshape({atom(value)}, "
                 f"{[chunk.rows, chunk.size // chunk.rows]}), {layout}))")
        return
    column = per_thread_column(b, s.indices, f.vars, f.extents)
    if column is not None:
        _into_column(ctx, s, column, value)
        return
    own = ctx.layouts[b.name]
    if f.masks:
        old = x if own == f.layout else f"gl.convert_layout({x}, {f.const})"
        value = f"gl.where({' & '.join(f.masks)}, {value}, {old})"
    if own != f.layout:
        value = f"gl.convert_layout({value}, {ctx.layout(b, s.loc)})"
    ctx.line(f"{x} = {value}")
    ctx.defined.add(b.name)


def _into_column(ctx: Ctx, s: ir.Store, column: ir.Expr, value: str) -> None:
    """Per-thread code over the thread dim writing one column of a per-thread local
    (``gathers.per_thread_column``): the thread's value merged into its row there (and where
    the loop's masks hold)."""
    f, b = ctx.par, s.buffer
    x = ctx.name(b.name)
    ctx.layout(b, s.loc)            # its layout declared (checked) as before
    along = ctx.layout_const(RowSlice(1, ctx.layouts[b.name]), "axis_layout")
    cols = ctx.layout_const(RowSlice(0, ctx.layouts[b.name]), "axis_layout")
    where = [f"(gl.expand_dims(gl.arange(0, {b.static_shape[1]}, layout={cols}), 0) == "
             f"{atom(spell(ctx, column))})"]
    where += [f"gl.expand_dims(gl.convert_layout({m}, {along}), 1)" for m in f.masks]
    row = f"gl.expand_dims(gl.convert_layout({value}, {along}), 1)"
    ctx.line(f"{x} = gl.where({' & '.join(where)}, {row}, {x})")
    ctx.defined.add(b.name)


def _spell_once(ctx: Ctx, e: ir.Expr) -> str:
    """``e`` with each subexpression it repeats (a Python variable of the user's program used
    several times: the bias of an epilogue, GELU's x) computed once into a temporary, innermost
    first, so a repeated global load is issued once."""
    seen: dict = {}
    for x in subexprs(e):
        if isinstance(x, (ir.BinOp, ir.Call, ir.Select, ir.Cast, ir.Bitcast, ir.UnOp)) or \
                isinstance(x, ir.Load) and x.buffer.scope is ir.Scope.GLOBAL:
            seen[x] = seen.get(x, 0) + 1
    with temporaries(ctx, [x for x, n in seen.items() if n > 1 and x is not e]):
        return spell(ctx, e)


def _mixed(e: ir.Expr, dtype: ir.DType) -> bool:
    """Whether ``e`` reads a value of another type than ``dtype`` (Triton's promotion of it may
    differ from the IR's: a float of another width, or an integer element in float math, which
    Triton computes in f32 next to a bf16)."""
    return any(isinstance(x, (ir.Load, ir.Var)) and x.dtype != dtype and x.dtype.is_float
               or isinstance(x, ir.Load) and dtype.is_float and not x.dtype.is_float
               for x in subexprs(e))


# ----------------------------------------------------------------------------------------------
# reductions and copies


_REDUCE = {ir.ReduceKind.MAX: ("gl.max", "gl.maximum({}, {})"),
           ir.ReduceKind.MIN: ("gl.min", "gl.minimum({}, {})"),
           ir.ReduceKind.SUM: ("gl.sum", "{} + {}"), ir.ReduceKind.ABSSUM: ("gl.sum", "{} + {}"),
           ir.ReduceKind.ABSMAX: ("gl.max", "gl.maximum({}, {})")}


def reduce(ctx: Ctx, s: ir.Reduce) -> None:
    src, dst = s.src, s.dst
    x = ctx.name(src.name)
    fn, combine = _REDUCE[s.kind]
    if s.kind.of_abs:
        x = f"gl.abs({x})"
    dtype = src.dtype
    if fn == "gl.sum" and src.dtype.is_float and src.dtype.bits < 32:
        x, dtype = f"{atom(x)}.to(gl.float32)", ir.DType.F32
    part = f"{fn}({x}, axis={s.dim})"
    if dtype != dst.dtype:
        part = f"{part}.to({GL_DTYPE[dst.dtype]})"
    if RowSlice(s.dim, ctx.layouts[src.name]) != ctx.layouts[dst.name]:
        part = f"gl.convert_layout({part}, {ctx.layout(dst, s.loc)})"
    y = ctx.name(dst.name)
    ctx.line(f"{y} = {part if s.clear else combine.format(y, part)}")
    ctx.defined.add(dst.name)


def load(ctx: Ctx, s: ir.Copy) -> None:
    """global -> fragment: a masked load when the copy is MASKED, cast to the fragment's type."""
    b, f = s.src.buffer, s.dst.buffer
    ptr, mask = tile_address(ctx, s.src, ctx.layouts[f.name], len(f.shape),
                             s.mechanism is ir.CopyMechanism.MASKED, s.loc)
    value = f"gl.load({ptr}{mask_arg(mask)})"
    if b.dtype != f.dtype:
        value += f".to({GL_DTYPE[f.dtype]})"
    ctx.line(f"{ctx.name(f.name)} = {value}")
    ctx.defined.add(f.name)


def store_tile(ctx: Ctx, s: ir.Copy) -> None:
    """fragment -> global, from registers: a masked store when the copy is MASKED; a leading
    block of the fragment is the whole fragment stored under a mask of the block's rows and
    columns (a block of extent 1 in a dim maps the fragment onto the destination's trailing
    dims)."""
    f, b = s.src.buffer, s.dst.buffer
    axes = [d for d, e in enumerate(s.dst.extents) if e != 1]
    rank = len(f.shape)
    if len(axes) < rank and tuple(s.dst.extents[-rank:]) == tuple(s.src.extents):
        # a leading block one row (or column) wide: the fragment's dims are the trailing ones
        axes = list(range(len(s.dst.extents) - rank, len(s.dst.extents)))
    full = dict(zip(axes, f.static_shape))
    dst = dataclasses.replace(s.dst, extents=tuple(full.get(d, e) for d, e in enumerate(s.dst.extents)))
    ptr, mask = tile_address(ctx, dst, ctx.layouts[f.name], len(f.shape),
                             s.mechanism is ir.CopyMechanism.MASKED, s.loc, valid=s.dst.extents)
    value = ctx.name(f.name) + (f".to({GL_DTYPE[b.dtype]})" if f.dtype != b.dtype else "")
    ctx.line(f"gl.store({ptr}, {value}{write_mask_arg(mask)})")


def tile_address(ctx: Ctx, g: ir.Region, layout, rank: int, masked: bool, loc,
                 valid: tuple = ()) -> tuple[str, list[str]]:
    """The pointer tensor of global region ``g`` as a ``rank``-d tile in ``layout`` (each of the
    region's non-unit dims an ``arange`` in the layout's slice along it) and, when ``masked``,
    the conditions keeping it inside the buffer (and above 0 where ``mask_low`` says so); where
    ``valid`` gives a dim fewer elements than ``g``, the condition keeping it inside those."""
    b = g.buffer
    axes = [d for d, e in enumerate(g.extents) if e != 1]
    ptr, mask = [ctx.pointer(b, loc)], []
    for d, (start, extent) in enumerate(zip(g.starts, g.extents)):
        index = spell(ctx, start)
        if d in axes:
            k = axes.index(d)
            along = ctx.layout_const(layout if rank == 1 else RowSlice(1 - k, layout), "axis_layout")
            name, offset = ctx.fresh(f"{b.name}_i{d}"), f"gl.arange(0, {extent}, layout={along})"
            if valid and valid[d] < extent:
                mask.append(f"(({name} - {atom(index)}) < {valid[d]})" if rank == 1 else
                            f"(gl.expand_dims({name} - {atom(index)}, {1 - k}) < {valid[d]})")
            ctx.line(f"{name} = {index} + {offset}")
            index = name if rank == 1 else f"gl.expand_dims({name}, {1 - k})"
        ptr.append(f"{atom(index)} * {ctx.stride(b, d)}")
        if masked:
            mask.append(f"({index} < {spell(ctx, b.shape[d])})")
            if g.mask_low and g.mask_low[d]:
                mask.append(f"({index} >= 0)")
    return " + ".join(ptr), mask


def copy(ctx: Ctx, s: ir.Copy) -> None:
    """fragment -> fragment: cast, then convert to the destination's layout if it differs; a
    vector into one row or column of a 2-d fragment (the destination's dim of extent 1) is a
    select of the vector, broadcast, where the index along that dim is the region's start."""
    src, dst = s.src.buffer, s.dst.buffer
    value = ctx.name(src.name)
    if src.dtype != dst.dtype:
        value = f"{value}.to({GL_DTYPE[dst.dtype]})"
    if not s.dst.is_whole:
        _into_line(ctx, s, value)
        return
    if ctx.layouts[src.name] != ctx.layouts[dst.name]:
        value = f"gl.convert_layout({value}, {ctx.layout(dst, s.loc)})"
    elif src.dtype == dst.dtype and src.dtype.itemsize == 4 and src in ctx.accumulators:
        # a copy of a wgmma accumulator, kept while the next wgmmas run (the attention
        # backward's previous dQ): ptxas serializes wgmmas around any read of registers a wgmma
        # defined (C7517, a wait for all in flight), so the copy is fresh registers, not folded
        value = (f'gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [{value}], '
                 f'dtype={GL_DTYPE[dst.dtype]}, is_pure=True, pack=1)')
    ctx.line(f"{ctx.name(dst.name)} = {value}")
    ctx.defined.add(dst.name)


def _into_line(ctx: Ctx, s: ir.Copy, value: str) -> None:
    dst = s.dst.buffer
    fixed = s.dst.extents.index(1)
    layout = ctx.layouts[dst.name]
    along = RowSlice(fixed, layout)
    if ctx.layouts[s.src.buffer.name] != along:
        value = f"gl.convert_layout({value}, {ctx.layout_const(along, 'axis_layout')})"
    across = ctx.layout_const(RowSlice(1 - fixed, layout), "axis_layout")
    index = f"gl.expand_dims(gl.arange(0, {dst.static_shape[fixed]}, layout={across}), {1 - fixed})"
    x = ctx.name(dst.name)
    ctx.line(f"{x} = gl.where({index} == {spell(ctx, s.dst.starts[fixed])}, "
             f"gl.expand_dims({value}, {fixed}), {x})")
    ctx.defined.add(dst.name)
