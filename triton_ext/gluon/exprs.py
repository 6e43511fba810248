"""Spelling Tile IR expressions in Gluon.

Outside ``T.Parallel`` every expression is a scalar (indices, coordinates, parities, fill
values); inside, the loop's indices are tensors in the loop's layout (``fragments.parallel``), a
fragment read is the fragment tensor in that layout (a vector expanded along the other axis,
``gl.convert_layout`` where its own layout differs), and math functions apply element-wise (in
f32 for 16-bit types). Scalars are: block indices, loop indices, scalar
parameters, constants, scalar locals (the role's Python variable of that name) and elements of
global buffers (``gl.load(A + i * A_stride0 + j * A_stride1, mask=..., other=0)``: out of bounds
reads 0, as in the IR; the pointer and strides are parameters of the role). Per-thread code reads
a run of a shared tile as a row slice of it (``chunk_view``), and so does a ``T.Parallel``
reading whole rows of one (in the loop's own layout). Integer ``//`` and
``%`` follow Python (floor) semantics; they are spelled natively when both operands are provably
non-negative (``tl``'s analysis, plus the scalar locals legalize found non-negative), else with a
remainder correction that is right whichever rounding Triton applies. Float ``/``, ``//`` and
``%`` are ``pysource.float_division``'s (docs/design.md's numeric contract: each rounded to its
type, ``//`` the floor of the rounded quotient, ``%`` Python's).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterable

from tilews.lowering import ir
from tilews.lowering.chunks import chunk_start
from tilews.lowering.errors import InternalError
from tilews.lowering.gathers import gathered_axis, per_thread_column
from tilews.lowering.layouts import NVMMAShared, RowSlice
from tilews.lowering.simplify import NONNEG_OPS
from tilews.lowering.traverse import subexprs

from ..pysource import FLOAT_DIVISIONS, atom, float_division, minmax, nonneg
from .context import GL_DTYPE, Ctx

_MATH = {ir.MathFn.EXP: "gl.exp", ir.MathFn.EXP2: "gl.exp2", ir.MathFn.LOG: "gl.log",
         ir.MathFn.LOG2: "gl.log2", ir.MathFn.SQRT: "gl.sqrt", ir.MathFn.RSQRT: "gl.rsqrt",
         ir.MathFn.ABS: "gl.abs", ir.MathFn.CEIL: "gl.ceil"}
_IEEE_ROUNDED = {ir.MathFn.SQRT: "gl.sqrt_rn"}   # where ``ctx.ieee_rounded`` (fp32)
_LOGICAL = {ir.BinOpKind.LAND: "&", ir.BinOpKind.LOR: "|"}


def spell(ctx: Ctx, e: ir.Expr) -> str:
    if ctx.named and e in ctx.named:      # (hashing an expression walks it: only when needed)
        return ctx.named[e]
    rule = _EXPRS.get(type(e))
    if rule is None:
        raise InternalError(f"gluon backend: no rule for expression {type(e).__name__}",
                            getattr(e, "loc", None))
    return rule(ctx, e)


@contextmanager
def temporaries(ctx: Ctx, exprs: Iterable[ir.Expr]):
    """Each of ``exprs`` spelled once into a temporary (a line each, inner ones first, so an
    outer one's spelling uses them), which ``spell`` reads for it until the block ends."""
    outside = ctx.named
    ctx.named = dict(outside)
    try:
        for x in sorted(exprs, key=lambda x: sum(1 for _ in subexprs(x))):
            text = spell(ctx, x)
            ctx.named[x] = ctx.fresh("t")
            ctx.line(f"{ctx.named[x]} = {text}")
        yield
    finally:
        ctx.named = outside


def arg(ctx: Ctx, e: ir.Expr) -> str:
    """``e`` spelled as a call argument (without enclosing parentheses)."""
    text = spell(ctx, e)
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for k, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return text[1:-1] if k == len(text) - 1 else text
    return text


def _const(ctx: Ctx, e: ir.Const) -> str:
    if isinstance(e.value, float) and not math.isfinite(e.value):
        return f"float('{e.value}')"
    return repr(e.value)


def _var(ctx: Ctx, e: ir.Var) -> str:
    return ctx.name(e.name)


def _binop(ctx: Ctx, e: ir.BinOp) -> str:
    a, b = spell(ctx, e.a), spell(ctx, e.b)
    if e.op in _LOGICAL:
        return f"({a} {_LOGICAL[e.op]} {b})"
    floor = e.op in (ir.BinOpKind.FLOORDIV, ir.BinOpKind.MOD) and e.dtype.is_int
    if floor and not (nonnegative(ctx, e.a) and nonnegative(ctx, e.b)):
        q, r = ctx.fresh("q"), ctx.fresh("r")
        ctx.line(f"{q} = {a} // {b}")
        ctx.line(f"{r} = {a} - {q} * {b}")
        fix = f"({r} < 0)" if (ir.as_int(e.b) or 0) > 0 else f"(({r} != 0) & (({r} < 0) != ({b} < 0)))"
        if e.op is ir.BinOpKind.FLOORDIV:
            return f"gl.where({fix}, {q} - 1, {q})"
        return f"gl.where({fix}, {r} + {b}, {r})"
    if e.op in FLOAT_DIVISIONS and e.dtype.is_float:
        a, b = (x if isinstance(o, ir.Const) or o.dtype == e.dtype else ctx.cast(x, e.dtype)
                for o, x in ((e.a, a), (e.b, b)))
        return float_division(ctx, e, a, b, "gl")
    return f"({a} {e.op.value} {b})"


def nonnegative(ctx: Ctx, e: ir.Expr) -> bool:
    """``tl``'s analysis, with the scalar locals legalize recorded as never negative."""
    if isinstance(e, ir.Load):
        return e.buffer.scope is ir.Scope.LOCAL and ctx.scalar_locals.get(e.buffer.name, False)
    if isinstance(e, ir.BinOp) and e.op in NONNEG_OPS:
        return nonnegative(ctx, e.a) and nonnegative(ctx, e.b)
    return nonneg(ctx, e)


def _load(ctx: Ctx, e: ir.Load) -> str:
    b = e.buffer
    if b.scope is ir.Scope.LOCAL:
        return ctx.scalar(b, e.loc)
    if b.scope is ir.Scope.FRAGMENT:
        return _fragment_element(ctx, e)
    if b.scope is ir.Scope.SHARED:
        if ctx.par is not None and (b.name, math.prod(ctx.par.extents)) in ctx.shared_chunks:
            return _shared_chunk(ctx, e)
        return _shared_element(ctx, e)
    if b.scope is not ir.Scope.GLOBAL:
        raise InternalError(f"gluon backend: no rule for reading {b.scope.value} buffer '{b.name}' "
                            f"element by element", e.loc)
    ptr, inside = element_address(ctx, b, e.indices, e.loc)
    return f"gl.load({ptr}{mask_arg(inside)})"


def mask_arg(conds: list[str]) -> str:
    """The ``mask=`` and ``other=`` arguments of an element load ("" when nothing is masked:
    the one element of a 0-dim tensor)."""
    return f"{write_mask_arg(conds)}, other=0" if conds else ""


def write_mask_arg(conds: list[str]) -> str:
    """The ``mask=`` argument of a store or an atomic ("" when nothing is masked)."""
    return f", mask={' & '.join(conds)}" if conds else ""


def element_address(ctx: Ctx, b: ir.Buffer, indices, loc) -> tuple[str, list[str]]:
    """The address of ``b[indices]`` (a pointer, or a pointer tensor inside ``T.Parallel``) and
    the conditions that keep it inside the buffer."""
    ptr = ctx.pointer(b, loc)
    inside = []
    for d, (i, n) in enumerate(zip(indices, b.shape)):
        index = spell(ctx, i)
        ptr += f" + {atom(index)} * {ctx.stride(b, d)}"
        inside += ([] if nonnegative(ctx, i) else [f"({index} >= 0)"]) + [f"({index} < {spell(ctx, n)})"]
    return ptr, inside


def _fragment_element(ctx: Ctx, e: ir.Load) -> str:
    """A fragment read inside the loop: the tensor itself, a vector expanded along the other
    axis, a gather along the dim whose index is computed (``gathers.gathered_axis``), or a
    per-thread local's column (``gathers.per_thread_column``: a gather along the row), in the
    loop's layout."""
    f, b = ctx.par, e.buffer
    if f is None:
        raise InternalError(f"gluon backend: fragment '{b.name}' read element by element outside "
                            f"a T.Parallel", e.loc)
    x, own = ctx.name(b.name), ctx.layouts[b.name]
    column = per_thread_column(b, e.indices, f.vars, f.extents)
    if column is not None:      # the thread's element of it, picked from its row
        pick = _indices(ctx, column, [f.extents[0], 1], ctx.layout(b, e.loc))
        return f"gl.convert_layout(gl.reshape(gl.gather({x}, {pick}, 1), [{f.extents[0]}]), {f.const})"
    if tuple(e.indices) == f.vars or len(f.vars) == 1 and e.indices[0] in f.vars:
        return x if own == f.layout else f"gl.convert_layout({x}, {f.const})"
    axis = gathered_axis(e, f.vars, f.extents)
    if axis is not None:
        src = x if own == f.layout else f"gl.convert_layout({x}, {f.const})"
        return f"gl.gather({src}, {_indices(ctx, e.indices[axis], list(f.extents), f.const)}, {axis})"
    axis = f.vars.index(e.indices[0])
    want = RowSlice(1 - axis, f.layout)
    v = x if own == want else f"gl.convert_layout({x}, {ctx.layout_const(want, 'axis_layout')})"
    return f"gl.expand_dims({v}, {1 - axis})"


def _indices(ctx: Ctx, index: ir.Expr, shape: list, layout: str) -> str:
    """A gather's index tensor: ``index`` (a constant, a scalar or a tensor of the loop) at each
    element of ``shape``."""
    if ir.as_int(index) is not None:
        return f"gl.full({shape}, {ir.as_int(index)}, gl.int32, layout={layout})"
    return f"gl.broadcast({atom(spell(ctx, index))}, gl.full({shape}, 0, gl.int32, layout={layout}))[0]"


def _shared_element(ctx: Ctx, e: ir.Load) -> str:
    """One element of a shared vector (unswizzled, its ring slot indexed) read inside the loop
    by every thread: the vector seen as [n, 1], n slots of one element over the same bytes, and
    the element's slot indexed; loaded in the loop's layout as a tensor of ones in each
    dimension, which broadcasts against the loop's."""
    f, b = ctx.par, e.buffer
    layout = ctx.layouts.get(b.name)
    if f is None or not isinstance(layout, NVMMAShared) or layout.rank != 1:
        raise InternalError(f"gluon backend: no rule for reading shared buffer '{b.name}' "
                            f"element by element other than an unswizzled vector inside a "
                            f"T.Parallel", e.loc)
    *rows, at = e.indices
    smem = ctx.name(b.name) + "".join(f".index({arg(ctx, i)})" for i in rows)
    column = (f"{smem}._reinterpret({GL_DTYPE[b.dtype]}, [{b.static_shape[-1]}, 1], "
              f"{ctx.layout(b, e.loc)}).index({arg(ctx, at)})")
    if len(f.vars) == 1:
        return f"{column}.load({f.const})"
    row = ctx.layout_const(RowSlice(1, f.layout), "axis_layout")
    return f"gl.expand_dims({column}.load({row}), 1)"


def _shared_chunk(ctx: Ctx, e: ir.Load) -> str:
    """Per-thread code reading one aligned run of a shared tile: its rows loaded (``chunk_view``),
    in the loop's shape and layout."""
    desc, chunk = chunk_view(ctx, e.buffer, e.indices, e.loc)
    f = ctx.par
    if chunk.layout == f.layout and chunk.rows == f.extents[0]:     # whole rows of a T.Parallel
        return f"{desc}.load({f.const})"
    value = f"{desc}.load({ctx.layout_const(chunk.layout, 'chunk_layout')})"
    return f"gl.convert_layout(gl.reshape({value}, {list(f.extents)}), {f.const})"


def chunk_view(ctx: Ctx, b: ir.Buffer, indices, loc):
    """Per-thread code's read or store of one aligned run of shared tile ``b`` (``lowering/
    chunks.py``): the descriptor of its rows — the tile, its ring slot indexed, sliced at the
    run's first row (a compile-time value: legalize_wgmma unrolled the loops it depends on), in
    the tile's own layout — and the plan's entry, whose layout places the run's elements in
    threads as the loop's per-thread layout does (reshaping between them moves no data)."""
    f = ctx.par
    size = math.prod(f.extents)
    chunk = ctx.shared_chunks.get((b.name, size))
    start = None if chunk is None else chunk_start(b.static_shape[chunk.slots:],
                                                   indices[chunk.slots:], f.vars, f.extents)
    if start is None:
        raise InternalError(f"gluon backend: no rule for per-thread code accessing shared buffer "
                            f"'{b.name}' other than a run the AsyncPlan's shared_chunks name", loc)
    smem = ctx.name(b.name) + "".join(f".index({arg(ctx, i)})" for i in indices[:chunk.slots])
    cols = size // chunk.rows
    return f"{smem}.slice({atom(spell(ctx, start))} // {cols}, {chunk.rows})", chunk


def _cmp(ctx: Ctx, e: ir.Cmp) -> str:
    return f"({spell(ctx, e.a)} {e.op.value} {spell(ctx, e.b)})"


def _unop(ctx: Ctx, e: ir.UnOp) -> str:
    a = spell(ctx, e.a)
    return f"({a} == 0)" if e.op is ir.UnOpKind.NOT else f"({e.op.value}{a})"


def _call(ctx: Ctx, e: ir.Call) -> str:
    args = [spell(ctx, a) for a in e.args]
    if e.fn in (ir.MathFn.MAX, ir.MathFn.MIN):
        return minmax(ctx, e, args, "gl")
    if ctx.par is None:
        raise InternalError(f"gluon backend: no rule for scalar {e.fn.value}() outside T.Parallel", e.loc)
    if e.dtype.bits >= 32:
        return f"{_math_fn(ctx, e.fn, e.dtype)}({args[0]})"
    # Gluon's transcendental functions take f32: compute in f32, round to the IR's type
    f32 = _math_fn(ctx, e.fn, ir.DType.F32)
    return f"{f32}({atom(args[0])}.to(gl.float32)).to({GL_DTYPE[e.dtype]})"


def _math_fn(ctx: Ctx, fn: ir.MathFn, computed_in: ir.DType) -> str:
    if fn in _IEEE_ROUNDED and ctx.ieee_rounded(computed_in):
        return _IEEE_ROUNDED[fn]
    return _MATH[fn]


def _cast(ctx: Ctx, e: ir.Cast) -> str:
    return f"gl.cast({spell(ctx, e.value)}, {GL_DTYPE[e.dtype]})"


def _bitcast(ctx: Ctx, e: ir.Bitcast) -> str:
    return f"gl.cast({spell(ctx, e.value)}, {GL_DTYPE[e.dtype]}, bitcast=True)"


def _select(ctx: Ctx, e: ir.Select) -> str:
    return f"gl.where({spell(ctx, e.cond)}, {spell(ctx, e.a)}, {spell(ctx, e.b)})"


_EXPRS: dict[type, Callable[[Ctx, ir.Expr], str]] = {
    ir.Const: _const, ir.Var: _var, ir.BinOp: _binop, ir.Cmp: _cmp, ir.UnOp: _unop,
    ir.Call: _call, ir.Cast: _cast, ir.Bitcast: _bitcast, ir.Select: _select, ir.Load: _load}
