"""Spelling Tile IR expressions and element addresses in MSL.

Every buffer is row-major and contiguous (launchers pass contiguous tensors), so an element's
offset is ``sum(index[d] * stride[d])`` with strides the products of the trailing dims (runtime
dims are the scalar parameters' locals); offsets into the ``StreamPlan``'s ``wide_offsets`` buffers
are computed in ``long``. A global element is read as zero and written not at all outside its
buffer (every ``index < dim``, and ``index >= 0`` where legalize's ``mask_low`` says it may be
negative). On-chip elements are read where their storage keeps them: shared memory at their
offset, a registers buffer at the slot of the current ``T.Parallel`` iteration (lowering made
every such access the owning thread's), a private buffer at the offset of the indices after the
thread's own, a replicated buffer at its offset.

Arithmetic follows the IR's types: operands are converted to the result type; integer ``//`` and
``%`` follow Python's floor semantics (``tws_floordiv``/``tws_mod`` unless both operands are
provably non-negative); float ``//`` is ``floor(a / b)`` and float ``%`` the exact remainder with the
divisor's sign (``tws_fmod``, in float), as docs/design.md's numeric contract says; math on 16-bit
floats is computed in float. FP8 elements are bytes, decoded
to half when read and encoded (round to nearest even, as torch) when written.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from tilews.lowering import ir
from tilews.lowering.errors import InternalError
from tilews.lowering.simplify import nonneg

from .context import Ctx, msl_type
from .fp8_decode import FP8_DECODE_MSL, decoder
from .fp8_encode import FP8_ENCODE_MSL, encoder

_MATH = {ir.MathFn.EXP: "exp", ir.MathFn.EXP2: "exp2", ir.MathFn.LOG: "log",
         ir.MathFn.LOG2: "log2", ir.MathFn.SQRT: "sqrt", ir.MathFn.RSQRT: "rsqrt",
         ir.MathFn.ABS: "abs", ir.MathFn.MAX: "max", ir.MathFn.MIN: "min", ir.MathFn.CEIL: "ceil"}

HELPERS = {
    "floordiv": ("inline int tws_floordiv(int a, int b) { int q = a / b; "
                 "return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }\n"
                 "inline long tws_floordiv(long a, long b) { long q = a / b; "
                 "return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }\n"),
    "mod": ("inline int tws_mod(int a, int b) { int r = a % b; "
            "return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }\n"
            "inline long tws_mod(long a, long b) { long r = a % b; "
            "return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }\n"),
    "fmod": ("inline float tws_fmod(float a, float b) { float r = fmod(a, b); "
             "return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }\n"),
}


def spell(ctx: Ctx, e: ir.Expr) -> str:
    rule = _EXPRS.get(type(e))
    if rule is None:
        raise InternalError(f"metal backend: no rule for expression {type(e).__name__}",
                            getattr(e, "loc", None))
    return rule(ctx, e)


def as_type(ctx: Ctx, e: ir.Expr, dtype: ir.DType, loc: ir.Loc) -> str:
    """``e`` converted to ``dtype`` (to an FP8 dtype: its encoded byte)."""
    text = spell(ctx, e)
    source = ir.DType.F16 if e.dtype.is_fp8 else e.dtype
    return text if source == dtype else convert(ctx, text, dtype, loc)


def convert(ctx: Ctx, text: str, dtype: ir.DType, loc: ir.Loc) -> str:
    """A value (not FP8 bytes: decoded ones are half) converted to ``dtype``."""
    if dtype is ir.DType.BOOL:
        return f"({text} != 0)"
    if dtype.is_fp8:
        ctx.helpers.add(FP8_ENCODE_MSL)
        return f"{encoder(dtype)}(static_cast<float>({text}))"
    return f"static_cast<{msl_type(dtype, loc)}>({text})"


# ----------------------------------------------------------------------------------------------
# element addresses


def strides(ctx: Ctx, b: ir.Buffer) -> list[str]:
    """Row-major strides of ``b``, spelled (runtime dims by their locals, constants folded)."""
    out, const, dims = [], 1, []
    for d in reversed(b.shape):
        out.append(" * ".join(([str(const)] if const != 1 or not dims else []) + dims))
        n = ir.as_int(d)
        if n is None:
            dims.append(spell(ctx, d))
        else:
            const *= n
    return out[::-1]


def offset(ctx: Ctx, b: ir.Buffer, indices: list[str]) -> str:
    wide = b.scope is ir.Scope.GLOBAL and b.name in ctx.wide
    terms = []
    for i, s in zip(indices, strides(ctx, b)):
        if i == "0":
            continue
        i = f"long({i})" if wide else f"({i})"
        terms.append(i if s == "1" else f"{i} * {s}")
    return " + ".join(terms) or "0"


def in_bounds(ctx: Ctx, b: ir.Buffer, indices: list[str], mask_low: tuple) -> Optional[str]:
    """The condition for a global element to lie inside its buffer, None when nothing to check."""
    conds = []
    low = mask_low or (True,) * len(indices)
    for i, d, lo in zip(indices, b.shape, low):
        if lo:
            conds.append(f"{i} >= 0")
        conds.append(f"{i} < {spell(ctx, d)}")
    return " && ".join(conds) or None


def element(ctx: Ctx, b: ir.Buffer, indices: list[str]) -> str:
    """The lvalue of an element of ``b`` (not a registers buffer outside its T.Parallel)."""
    where = ctx.where(b)
    name = ctx.name(b.name)
    if where == "registers":
        if ctx.par is None or not ctx.par.slot:
            raise InternalError(f"metal backend: registers buffer '{b.name}' read outside a "
                                f"T.Parallel dealt element by element")
        return f"{name}[{ctx.par.slot}]"
    if where == "private":      # this thread's part: the indices after the thread's own
        n = len(ctx.storage.thread_shape)
        local = ir.Buffer(b.name, b.shape[n:], b.dtype, b.scope)
        return f"{name}[{offset(ctx, local, indices[n:])}]"
    if where == "matrix":
        staged = dict(ctx.par.staged) if ctx.par is not None else {}
        if b.name not in staged:
            raise InternalError(f"metal backend: element access to the matrix buffer '{b.name}' "
                                f"outside a T.Parallel run per simdgroup tile")
        return staged[b.name]
    return f"{name}[{offset(ctx, b, indices)}]"


def decoded(ctx: Ctx, value: str, dtype: ir.DType) -> str:
    """An element of ``dtype`` as a value: FP8 bytes decoded to half, others as they are."""
    if not dtype.is_fp8:
        return value
    ctx.helpers.add(FP8_DECODE_MSL)
    return f"{decoder(dtype)}({value})"


def read(ctx: Ctx, b: ir.Buffer, indices: list[str], mask_low: Optional[tuple] = (),
         decode: bool = True) -> str:
    """An element's value. A global element outside its buffer reads as zero unless ``mask_low``
    is None (the access is in bounds by construction). FP8 bytes are decoded to half unless
    ``decode`` is off (a byte-for-byte copy)."""
    fp8 = b.dtype.is_fp8 and decode
    value = decoded(ctx, element(ctx, b, indices), b.dtype) if decode else element(ctx, b, indices)
    if b.scope is ir.Scope.GLOBAL and mask_low is not None:
        cond = in_bounds(ctx, b, indices, mask_low)
        if cond:
            zero = "half(0)" if fp8 else f"{msl_type(b.dtype, ir.UNKNOWN_LOC)}(0)"
            value = f"(({cond}) ? {value} : {zero})"
    return value


# ----------------------------------------------------------------------------------------------
# expressions


def _const(ctx: Ctx, e: ir.Const) -> str:
    v = e.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if e.dtype.is_float:
        v = float(v)
        if math.isnan(v):
            text = "NAN"
        elif math.isinf(v):
            text = "INFINITY" if v > 0 else "(-INFINITY)"
        else:
            text = repr(v) + "f"
        return text if e.dtype is ir.DType.F32 else f"{msl_type(e.dtype, e.loc)}({text})"
    if e.dtype.bits == 64:
        return f"{int(v)}L" if e.dtype.record.kind == "int" else f"{int(v)}UL"
    if e.dtype.bits < 32:      # typed, so min/max and as_type see the IR's type
        return f"{msl_type(e.dtype, e.loc)}({int(v)})"
    return str(int(v)) if e.dtype.record.kind != "uint" else f"{int(v)}u"


def _var(ctx: Ctx, e: ir.Var) -> str:
    return ctx.name(e.name)


def _operand(ctx: Ctx, e: ir.Expr, dtype: ir.DType) -> str:
    if isinstance(e, ir.Const) and not isinstance(e.value, bool):
        return _const(ctx, ir.Const(e.value, dtype, e.loc))
    return as_type(ctx, e, dtype, e.loc)


def _binop(ctx: Ctx, e: ir.BinOp) -> str:
    if e.op in (ir.BinOpKind.LAND, ir.BinOpKind.LOR):
        sym = "&&" if e.op is ir.BinOpKind.LAND else "||"
        return f"({spell(ctx, e.a)} {sym} {spell(ctx, e.b)})"
    a, b = _operand(ctx, e.a, e.dtype), _operand(ctx, e.b, e.dtype)
    if e.op in (ir.BinOpKind.FLOORDIV, ir.BinOpKind.MOD):
        if e.dtype.is_float and e.op is ir.BinOpKind.FLOORDIV:   # the quotient rounded first
            if e.dtype is ir.DType.F32:
                return f"floor({a} / {b})"
            q = f"static_cast<float>({convert(ctx, f'({a} / {b})', e.dtype, e.loc)})"
            return convert(ctx, f"floor({q})", e.dtype, e.loc)
        if e.dtype.is_float:    # the exact remainder, given the divisor's sign
            ctx.helpers.add(HELPERS["fmod"])
            r = f"tws_fmod(static_cast<float>({a}), static_cast<float>({b}))"
            return r if e.dtype is ir.DType.F32 else convert(ctx, r, e.dtype, e.loc)
        if not (nonneg(e.a, ctx.nonneg) and nonneg(e.b, ctx.nonneg)) and e.dtype.record.kind == "int":
            helper = "floordiv" if e.op is ir.BinOpKind.FLOORDIV else "mod"
            ctx.helpers.add(HELPERS[helper])
            return f"tws_{helper}({a}, {b})"
        return f"({a} {'/' if e.op is ir.BinOpKind.FLOORDIV else '%'} {b})"
    return _rounded(ctx, f"({a} {e.op.value} {b})", e)


def _rounded(ctx: Ctx, text: str, e: ir.Expr) -> str:
    """The result of an arithmetic operation converted to its 16-bit float type: so each one is
    rounded (C++ computes ``half`` with float's excess precision, and the harness's ``bfloat``
    arithmetic gives float; MSL's gives the type, where the conversion costs nothing)."""
    narrow = e.dtype.is_float and e.dtype.bits < 32 and not e.dtype.is_fp8
    return convert(ctx, text, e.dtype, e.loc) if narrow else text


def _cmp(ctx: Ctx, e: ir.Cmp) -> str:
    common = _common(e.a.dtype, e.b.dtype)
    return f"({_operand(ctx, e.a, common)} {e.op.value} {_operand(ctx, e.b, common)})"


def _common(a: ir.DType, b: ir.DType) -> ir.DType:
    if a == b:
        return a
    if a.is_float or b.is_float:
        return ir.DType.F32
    return a if a.bits >= b.bits else b


def _unop(ctx: Ctx, e: ir.UnOp) -> str:
    a = spell(ctx, e.a)
    if e.op is ir.UnOpKind.NOT:
        return f"(!{a})"
    return _rounded(ctx, f"({e.op.value}{_operand(ctx, e.a, e.dtype)})", e)


def _call(ctx: Ctx, e: ir.Call) -> str:
    narrow = e.dtype.is_float and e.dtype.bits < 32
    work = ir.DType.F32 if narrow else e.dtype
    args = [_operand(ctx, a, work) for a in e.args]
    fn = _MATH[e.fn]
    out = args[0] if e.fn in (ir.MathFn.MAX, ir.MathFn.MIN) else f"{fn}({args[0]})"
    for a in args[1:]:
        out = f"{fn}({out}, {a})"
    return convert(ctx, out, e.dtype, e.loc) if narrow else out


def _cast(ctx: Ctx, e: ir.Cast) -> str:
    """The converted value; into FP8, the encoded byte decoded (an FP8 value is a half)."""
    return decoded(ctx, as_type(ctx, e.value, e.dtype, e.loc), e.dtype)


def _bitcast(ctx: Ctx, e: ir.Bitcast) -> str:
    """``as_type`` of the value held at its own width (arithmetic on narrow integers is int in
    MSL); FP8 values go through their bytes (a decoded FP8 value is a half)."""
    source = e.value.dtype
    bits = spell(ctx, e.value)
    if source.is_fp8:
        bits = convert(ctx, bits, source, e.loc)       # the encoded byte
    bits = f"as_type<{msl_type(e.dtype, e.loc)}>(static_cast<{msl_type(source, e.loc)}>({bits}))"
    return decoded(ctx, bits, e.dtype)


def _select(ctx: Ctx, e: ir.Select) -> str:
    return (f"({spell(ctx, e.cond)} ? {_operand(ctx, e.a, e.dtype)} : "
            f"{_operand(ctx, e.b, e.dtype)})")


def _load(ctx: Ctx, e: ir.Load) -> str:
    return read(ctx, e.buffer, [spell(ctx, i) for i in e.indices], e.mask_low)


_EXPRS: dict[type, Callable[[Ctx, ir.Expr], str]] = {
    ir.Const: _const, ir.Var: _var, ir.BinOp: _binop, ir.Cmp: _cmp, ir.UnOp: _unop,
    ir.Call: _call, ir.Cast: _cast, ir.Bitcast: _bitcast, ir.Select: _select, ir.Load: _load}
