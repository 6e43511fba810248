"""Spelling Tile IR expressions as ``triton.language`` expressions.

Outside ``T.Parallel`` an expression is a scalar; inside, every parallel variable is a
``tl.arange`` laid along its own axis, so an expression is a tensor that broadcasts over the loop
nest. Element accesses:

* a global element ``A[i, j]`` is a masked ``tl.load`` at ``A + i * A_stride0 + j * A_stride1``
  (``bounds``: ``i < dim`` always, ``i >= 0`` where legalize's ``mask_low`` says ``i`` may be
  negative; offsets in 64 bits for the buffers in the ``StreamPlan``'s ``wide_offsets``); in
  per-thread code (``Parallel.per_thread``) a load of the loop's whole shape (``Access.READ``);
* an on-chip buffer indexed by the parallel variables (each over the buffer's whole extent, in any
  order, or a subset of them; ``0`` on unit dims) is the register tensor itself, permuted and
  broadcast into the loop's axes;
* an on-chip element at indices that do not involve the parallel variables is extracted with a
  one-hot ``tl.where`` and a sum (of a float's bits); where the buffer's other dims are indexed by
  parallel variables as above (``A_local[t, k]`` at a serial ``k``), only the former dims are
  (``_picked``), which costs nothing where they lie in each thread's registers and the index is
  a constant after unrolling; a local buffer of shape (1,) is a plain scalar;
* an on-chip buffer indexed otherwise inside ``T.Parallel`` (``B[i, j // 2]``, a loop of another
  extent) is gathered (``tl.gather`` of the flat buffer at each iteration's offset).

On-chip buffers are tensors of ``StreamPlan.tile`` of their shape (``Ctx.shape``).

Integer ``//`` and ``%`` follow Python (floor) semantics; they are spelled natively when both
operands are provably non-negative or Python ints, else through a remainder correction that is
right whichever rounding Triton applies (constants fold in Python, tensors truncate). Under
``StreamPlan.python_ints`` (Triton's CPU interpreter) integer arithmetic of no tensor operand
(constant scalar parameters, loop indices) is Python's, exact: each result that may leave its
type is wrapped to it (``python_int``, ``_wrapped``), as every target's runtime arithmetic wraps. Float ``//`` is the floor of
the rounded quotient, float ``%`` Triton's (C's ``fmod``) corrected to the divisor's sign: the
numeric contract of docs/design.md (``pysource.float_division``). Values of the plan's ``f32_values`` types (bfloat16 under
Triton's CPU interpreter) are float32 tensors: each operation of such a type is rounded to it
(``Ctx.round_held``), global elements are converted from and to their bits (``Ctx.unpack``,
``Ctx.pack``).
"""
from __future__ import annotations

import enum
import math
from typing import Callable, Optional

from tilews.lowering import ir, simplify
from tilews.lowering.errors import InternalError
from tilews.lowering.traverse import subexprs

from ..pysource import FLOAT_DIVISIONS, atom, float_division, minmax, nonneg
from .context import TL_DTYPE, Ctx, arange, shape_text

_MATH = {ir.MathFn.EXP: "tl.exp", ir.MathFn.EXP2: "tl.exp2", ir.MathFn.LOG: "tl.log",
         ir.MathFn.LOG2: "tl.log2", ir.MathFn.SQRT: "tl.sqrt", ir.MathFn.RSQRT: "tl.rsqrt",
         ir.MathFn.CEIL: "tl.ceil"}
_IEEE_ROUNDED = {ir.MathFn.SQRT: "tl.sqrt_rn"}   # where ``ctx.ieee_rounded`` (fp32)

def spell(ctx: Ctx, e: ir.Expr) -> str:
    rule = _EXPRS.get(type(e))
    if rule is None:
        raise InternalError(f"triton backend: no rule for expression {type(e).__name__}",
                            getattr(e, "loc", None))
    return rule(ctx, e)


def cast(ctx: Ctx, e: ir.Expr, dtype: ir.DType) -> str:
    """``e`` converted to ``dtype`` (a tensor even when ``e`` is a Python constant)."""
    if e.dtype == dtype:    # a constant or scalar: its value is one of the type already
        return f"tl.cast({spell(ctx, e)}, {TL_DTYPE[ctx.held(dtype)]})"
    return ctx.cast(spell(ctx, e), dtype)


def value_as(ctx: Ctx, e: ir.Expr, dtype: ir.DType) -> str:
    """``e`` as a tensor of ``dtype``, cast unless it is one already (it reads an element or a
    parallel index; constants, parameters and loop indices may be plain Python numbers)."""
    tensor = any(isinstance(x, ir.Load) or ctx.par is not None and x in ctx.par.vars
                 for x in subexprs(e))
    return spell(ctx, e) if tensor and e.dtype == dtype else cast(ctx, e, dtype)


def _const(ctx: Ctx, e: ir.Const) -> str:
    if isinstance(e.value, bool) or not isinstance(e.value, float):
        return repr(e.value)
    if math.isfinite(e.value):
        return repr(e.value)
    return f"float('{e.value}')"


def _var(ctx: Ctx, e: ir.Var) -> str:
    return ctx.name(e.name)


def _operand(ctx: Ctx, e: ir.Expr, dtype: ir.DType) -> str:
    if isinstance(e, ir.Const) or e.dtype == dtype:
        return spell(ctx, e)
    return cast(ctx, e, dtype)


def _binop(ctx: Ctx, e: ir.BinOp) -> str:
    if python_int(ctx, e):
        return _wrapped(ctx, e, f"({spell(ctx, e.a)} {e.op.value} {spell(ctx, e.b)})")
    if e.op in (ir.BinOpKind.LAND, ir.BinOpKind.LOR):
        sym = "&" if e.op is ir.BinOpKind.LAND else "|"
        return f"({spell(ctx, e.a)} {sym} {spell(ctx, e.b)})"
    a, b = _operand(ctx, e.a, e.dtype), _operand(ctx, e.b, e.dtype)
    signed = not (nonneg(ctx, e.a) and nonneg(ctx, e.b))
    if e.op in (ir.BinOpKind.FLOORDIV, ir.BinOpKind.MOD) and e.dtype.is_int and signed:
        return _floor_divmod(ctx, e.op, a, b, ir.as_int(e.b))
    if e.op in FLOAT_DIVISIONS and e.dtype.is_float:
        return float_division(ctx, e, a, b, "tl")
    return _rounded(ctx, f"({a} {e.op.value} {b})", e.dtype)


def python_int(ctx: Ctx, e: ir.Expr) -> bool:
    """Whether integer expression ``e`` is spelled as arithmetic on Python ints
    (``StreamPlan.python_ints``): a constant, a variable Triton's interpreter holds as a Python int
    (a constant scalar parameter, the index of a loop of such bounds), or an operation of
    ``_PYTHON_OPS`` on such operands of its own type, spelled with Python's operator (whose ``//``
    and ``%`` floor, as the IR's)."""
    if not ctx.plan.python_ints or not e.dtype.is_int:
        return False
    if isinstance(e, ir.Const):
        return True
    if isinstance(e, ir.Var):
        return e.kind in (ir.VarKind.PARAM, ir.VarKind.LOOP) and e not in ctx.runtime
    if isinstance(e, ir.BinOp) and e.op in _PYTHON_OPS:
        return all(isinstance(x, ir.Const) or x.dtype == e.dtype and python_int(ctx, x) for x in (e.a, e.b))
    return isinstance(e, ir.UnOp) and e.op is not ir.UnOpKind.NOT and python_int(ctx, e.a)


_PYTHON_OPS = set(ir.BinOpKind) - {ir.BinOpKind.DIV, ir.BinOpKind.LAND, ir.BinOpKind.LOR}
# operations of a type's values whose exact result may lie outside the type (a negation too)
_MAY_LEAVE = {ir.BinOpKind.ADD, ir.BinOpKind.SUB, ir.BinOpKind.MUL, ir.BinOpKind.SHL,
              ir.BinOpKind.FLOORDIV}


def _wrapped(ctx: Ctx, e: ir.Expr, x: str) -> str:
    """``x``, Python int arithmetic computing ``e``, wrapped to ``e``'s type (two's complement), as
    runtime integer arithmetic is on every target (docs/design.md), where its result may leave the
    type (``simplify.interval`` does not show it inside)."""
    if isinstance(e, ir.BinOp) and e.op not in _MAY_LEAVE:
        return x
    span = simplify.interval(e, ctx.ranges)
    if span is not None and all(e.dtype.wrap(v) == v for v in span):
        return x
    bits, signed = e.dtype.bits, e.dtype.record.kind == "int"
    mask = f"0x{(1 << bits) - 1:X}"
    if not signed:
        return f"({x} & {mask})"
    half = f"0x{1 << (bits - 1):X}"
    return f"((({x} + {half}) & {mask}) - {half})"


def _rounded(ctx: Ctx, x: str, dt: ir.DType) -> str:
    """The result ``x`` of a float operation of type ``dt`` computed as ``dt`` is held: rounded
    to ``dt`` where that is float32 (``StreamPlan.f32_values``)."""
    return ctx.round_held(x, dt) if dt in ctx.plan.f32_values else x


def _floor_divmod(ctx: Ctx, op: ir.BinOpKind, a: str, b: str, b_const: Optional[int]) -> str:
    q, r = ctx.fresh("q"), ctx.fresh("r")
    ctx.line(f"{q} = {a} // {b}")
    ctx.line(f"{r} = {a} - {q} * {b}")
    fix = f"({r} < 0)" if b_const is not None and b_const > 0 else \
        f"(({r} != 0) & (({r} < 0) != ({b} < 0)))"
    if op is ir.BinOpKind.FLOORDIV:
        return f"tl.where({fix}, {q} - 1, {q})"
    return f"tl.where({fix}, {r} + {b}, {r})"


def _cmp(ctx: Ctx, e: ir.Cmp) -> str:
    return f"({spell(ctx, e.a)} {e.op.value} {spell(ctx, e.b)})"


def _unop(ctx: Ctx, e: ir.UnOp) -> str:
    a = spell(ctx, e.a)
    if e.op is ir.UnOpKind.NOT:
        return f"({a} == 0)"
    return _wrapped(ctx, e, f"({e.op.value}{a})") if python_int(ctx, e) else f"({e.op.value}{a})"


def _call(ctx: Ctx, e: ir.Call) -> str:
    args = [spell(ctx, a) for a in e.args]
    if e.fn in (ir.MathFn.MAX, ir.MathFn.MIN):
        return minmax(ctx, e, args, "tl")
    if e.fn is ir.MathFn.ABS:
        return f"tl.abs({args[0]})"
    if e.dtype.bits >= 32:
        return f"{_math_fn(ctx, e.fn, e.dtype)}({args[0]})"
    # triton's transcendental functions take f32/f64: compute in f32, round to the IR's type
    return ctx.cast(f"{_math_fn(ctx, e.fn, ir.DType.F32)}(tl.cast({args[0]}, tl.float32))", e.dtype)


def _math_fn(ctx: Ctx, fn: ir.MathFn, computed_in: ir.DType) -> str:
    if fn in _IEEE_ROUNDED and ctx.ieee_rounded(computed_in):
        return _IEEE_ROUNDED[fn]
    return _MATH[fn]


def _cast(ctx: Ctx, e: ir.Cast) -> str:
    return cast(ctx, e.value, e.dtype)


def _bitcast(ctx: Ctx, e: ir.Bitcast) -> str:
    bits = ctx.pack(spell(ctx, e.value), e.value.dtype)
    return ctx.unpack(f"tl.cast({bits}, {TL_DTYPE[e.dtype]}, bitcast=True)", e.dtype)


def _select(ctx: Ctx, e: ir.Select) -> str:
    return f"tl.where({spell(ctx, e.cond)}, {spell(ctx, e.a)}, {spell(ctx, e.b)})"


def masked_load(ptr: str, mask: Optional[str], dtype: ir.DType, streamed: bool = False) -> str:
    """A load whose masked-off lanes read a zero of the element type (Triton's CPU interpreter
    cannot cast an integer 0 to an FP8 type); ``streamed``: marked first to evict (data read once,
    which should not push out what other blocks read again)."""
    hint = ", eviction_policy='evict_first'" if streamed else ""
    if mask is None:
        return f"tl.load({ptr}{hint})"
    return f"tl.load({ptr}{mask_arg(mask)}, other={'0.0' if dtype.is_float else '0'}{hint})"


def _streamed(ctx: Ctx, e: ir.Load) -> bool:
    """A load of per-thread code that streams through its block's own data: its address reads
    every block index (no other block reads the element) and a serial loop's index (each
    iteration reads new data) — the B of TileLang's thread-level GEMV (a streaming hint there:
    14336 x 4096 on an H200, 30.1 -> 29.3 us; scripts/probe_gemv_regs.py)."""
    if ctx.par is None or not ctx.par.per_thread or not ctx.kernel.block_vars:
        return False
    read = {x for i in e.indices for x in subexprs(i) if isinstance(x, ir.Var)}
    return set(ctx.kernel.block_vars) <= read and any(v.kind is ir.VarKind.LOOP for v in read)


def _load(ctx: Ctx, e: ir.Load) -> str:
    b = e.buffer
    if b.scope is ir.Scope.GLOBAL:
        ptr, mask = element_ptr(ctx, b, e.indices, e.mask_low, e.loc, Access.READ)
        return ctx.unpack(masked_load(ptr, mask, b.dtype, _streamed(ctx, e)), b.dtype)
    if b in ctx.scalars:
        return ctx.name(b.name)
    axes = parallel_axes(ctx, b, e.indices)
    if axes is not None:
        return parallel_view(ctx, b, axes)
    if ctx.par is None or not ctx.par.axes(e.indices):
        return _picked(ctx, b, e.indices, range(len(e.indices)))
    fixed = [d for d, i in enumerate(e.indices) if not ctx.par.axes([i])]
    rest = [d for d in range(len(e.indices)) if d not in fixed]
    axes = _axes(ctx, [e.indices[d] for d in rest], [b.static_shape[d] for d in rest])
    if fixed and axes is not None:      # B[i, k]: the loop's i, a k of no parallel variable
        shape = [ctx.shape(b)[d] for d in rest]
        return _view(ctx, _picked(ctx, b, e.indices, fixed), shape, axes)
    return _gather(ctx, b, e.indices)


def _picked(ctx: Ctx, b: ir.Buffer, indices, dims) -> str:
    """On-chip ``b`` with each dim of ``dims`` reduced to its element at ``indices[d]`` (an index
    the parallel variables do not read): the element kept by a one-hot select and the dim summed
    away, a float as its bits (exact whatever its value; where a dim lies in each thread's
    registers and the index is a constant, the selects and sums fold away)."""
    held = ctx.held(b.dtype)
    x, dt = ctx.name(b.name), TL_DTYPE[held]
    bits = _BITS[held.bits] if held.is_float else None
    if bits:
        x = f"{x}.to({bits}, bitcast=True)"
    x = f"tl.where({one_hot(ctx, b, [i if d in dims else None for d, i in enumerate(indices)])}, {x}, 0)"
    if len(dims) == len(indices):
        x = f"tl.sum({x}, axis=None)"
    else:
        for d in sorted(dims, reverse=True):
            x = f"tl.sum({x}, axis={d})"
    return f"{x}.to({bits}).to({dt}, bitcast=True)" if bits else f"{x}.to({dt})"


_BITS = {8: "tl.int8", 16: "tl.int16", 32: "tl.int32", 64: "tl.int64"}   # a float's bits


def _gather(ctx: Ctx, b: ir.Buffer, indices) -> str:
    """On-chip elements at indices computed from the parallel variables (``B[i, j // 2]``): the
    flat buffer gathered at each iteration's flat offset (each index clamped into its dim, so
    iterations that do not exist read some element)."""
    shape = ctx.shape(b)
    terms = []
    for d, (i, n) in enumerate(zip(indices, b.static_shape)):
        stride = math.prod(shape[d + 1:])
        index = spell(ctx, i)
        if ctx.par.axes([i]):
            index = f"tl.minimum(tl.maximum({index}, 0), {n - 1})"
        terms.append(index if stride == 1 else f"{atom(index)} * {stride}")
    flat = ctx.fresh(f"{b.name}_at")
    ctx.line(f"{flat} = tl.broadcast_to({' + '.join(terms)}, {shape_text(ctx.par.shape)})")
    x = f"tl.reshape({ctx.name(b.name)}, ({math.prod(shape)},))"
    lanes = f"tl.reshape({flat}, ({math.prod(ctx.par.shape)},))"
    return f"tl.reshape(tl.gather({x}, {lanes}, 0), {shape_text(ctx.par.shape)})"


_EXPRS: dict[type, Callable[[Ctx, ir.Expr], str]] = {
    ir.Const: _const, ir.Var: _var, ir.BinOp: _binop, ir.Cmp: _cmp, ir.UnOp: _unop,
    ir.Call: _call, ir.Cast: _cast, ir.Bitcast: _bitcast, ir.Select: _select, ir.Load: _load}


# ----------------------------------------------------------------------------------------------
# element access


class Access(enum.Enum):
    """What a global element access inside ``T.Parallel`` does, which decides how it meets the
    mask of the enclosing ``if``s when that mask spans loop axes its address does not (Triton
    takes no mask wider than the pointer)."""
    READ = "read"     # one load shared by those lanes; the ifs do not guard it (its own bounds
                      # mask keeps it in the buffer, and a value no lane uses is harmless). In
                      # per-thread code each lane's own load, under its ifs (every thread loads
                      # what it reads: the load has the loop's shape, so Triton lays it out as
                      # the loop's other tensors, each thread's elements in that thread)
    WRITE = "write"   # each lane's write, under its own ifs: the address is broadcast over the
                      # loop (lanes that differ only along the other axes store the same value)
    ADD = "add"       # one add per lane, whatever the ifs: the address is always broadcast


def element_ptr(ctx: Ctx, b: ir.Buffer, indices, mask_low: tuple[bool, ...],
                loc: ir.Loc, access: Access) -> tuple[str, Optional[str]]:
    """Pointer and mask (in bounds, and the enclosing parallel `if`s as ``access`` says) of
    global elements; None when nothing needs masking (every index a constant inside its static
    dimension). This is the one place that matches an address's shape (the loop axes its indices
    read) with the mask's."""
    idx = [spell(ctx, i) for i in indices]
    ptr = " + ".join([ctx.name(b.name)] + [offset(ctx, b, d, atom(i)) for d, i in enumerate(idx)])
    conds = bounds(ctx, b, idx, mask_low, loc, indices)
    par = ctx.par
    if par is not None:
        spans = par.axes(indices)
        wider = not par.mask_axes() <= spans
        per_lane = access is Access.ADD or access is Access.WRITE and wider or \
            access is Access.READ and par.per_thread and len(spans) < len(par.shape)
        if per_lane:
            ptr, wider = f"tl.broadcast_to({ptr}, {shape_text(par.shape)})", False
        if par.mask() and not wider:
            conds.append(par.mask())
    return ptr, " & ".join(conds) or None


def mask_arg(mask: Optional[str]) -> str:
    """The ``mask=`` argument of a load or store ("" without one)."""
    return "" if mask is None else f", mask={mask}"


def offset(ctx: Ctx, b: ir.Buffer, d: int, index: str) -> str:
    """``index * stride`` along dim ``d`` of global ``b`` (``index`` an operand of ``*``), in 64
    bits for the buffers in the plan's ``wide_offsets``."""
    if b.name in ctx.plan.wide_offsets:
        index = f"tl.cast({index}, tl.int64)"
    return f"{index} * {ctx.stride(b, d)}"


def bounds(ctx: Ctx, b: ir.Buffer, indices: list[str], mask_low: tuple[bool, ...],
           loc: ir.Loc, exprs=None) -> list[str]:
    """Conditions that ``indices`` (spelled; ``exprs``, where given, the same as IR) lie inside
    global ``b``: ``< dim`` on every dim whose index is not known to stay below a build-time dim
    (``simplify.interval`` over the writer's variable ranges), ``>= 0`` on the dims ``mask_low``
    (legalize's decision) marks."""
    if len(mask_low) != len(indices):
        raise InternalError(f"triton backend: an access to '{b.name}' has no mask_low decision "
                            f"(legalize makes it)", loc)
    conds = []
    for d, (i, dim, low) in enumerate(zip(indices, b.shape, mask_low)):
        if low:
            conds.append(f"({i} >= 0)")
        size = ir.as_int(dim)
        span = simplify.interval(exprs[d], ctx.ranges) if exprs is not None else None
        inside = size is not None and (i.isdigit() and int(i) < size or span is not None and span[1] < size)
        if not inside:
            conds.append(f"({i} < {spell(ctx, dim)})")
    return conds


def parallel_axes(ctx: Ctx, b: ir.Buffer, indices) -> Optional[list[Optional[int]]]:
    """For each dim of ``b``: the parallel axis indexing it (None for a unit dim indexed by 0), or
    None if the indices are not that pattern."""
    return _axes(ctx, indices, b.static_shape)


def _axes(ctx: Ctx, indices, extents) -> Optional[list[Optional[int]]]:
    """``parallel_axes`` of indices into dims of ``extents``."""
    if ctx.par is None:
        return None
    axes: list[Optional[int]] = []
    for i, n in zip(indices, extents):
        a = ctx.par.axis(i)
        if a is not None and ctx.par.extents[a] == n and a not in axes:
            axes.append(a)
        elif n == 1 and ir.as_int(i) == 0:
            axes.append(None)
        else:
            return None
    return axes if any(a is not None for a in axes) else None


def parallel_view(ctx: Ctx, b: ir.Buffer, axes: list[Optional[int]]) -> str:
    """The register tensor of ``b`` laid out along the loop's axes (broadcast over the others)."""
    return _view(ctx, ctx.name(b.name), ctx.shape(b), axes)


def _view(ctx: Ctx, x: str, shape, axes: list[Optional[int]]) -> str:
    """Tensor ``x`` of ``shape`` whose dims are the loop's ``axes`` (``parallel_axes``) laid out
    along the loop's axes."""
    present = [a for a in axes if a is not None]
    if len(present) != len(axes):
        x = f"tl.reshape({x}, {shape_text([n for n, a in zip(shape, axes) if a is not None])})"
    order = sorted(range(len(present)), key=lambda k: present[k])
    if order != list(range(len(present))):
        x = f"tl.permute({x}, {shape_text(order)})"
    rank = len(ctx.par.extents)
    if len(present) < rank:
        x = f"{x}[{', '.join(':' if a in present else 'None' for a in range(rank))}]"
    return x


def from_parallel(ctx: Ctx, value: str, b: ir.Buffer, axes: list[Optional[int]]) -> str:
    """A tensor over the loop's axes that ``axes`` uses (in loop order) converted to ``b``'s
    layout."""
    present = [a for a in axes if a is not None]
    if present != sorted(present):
        value = f"tl.permute({value}, {shape_text([sorted(present).index(a) for a in present])})"
    if len(present) != len(axes):
        value = f"tl.reshape({value}, {shape_text(ctx.shape(b))})"
    return value


def one_hot(ctx: Ctx, b: ir.Buffer, indices) -> str:
    """A mask over ``b``'s shape selecting the element at ``indices`` (an index None selects
    the whole dim)."""
    rank = len(b.static_shape)
    return " & ".join(f"({arange(n, d, rank)} == {spell(ctx, i)})"
                      for d, (i, n) in enumerate(zip(indices, ctx.shape(b))) if i is not None)
