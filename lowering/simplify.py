"""Integer evaluation, constant folding and sign analysis of Tile IR expressions: the one home of
each.

``evaluate(e, env)`` is the value of an expression whose variables are all bound in ``env``
(despecialize walks loops with it); ``fold_binop`` drops one operation where that is exact, as the
frontend's operators build it; ``fold`` rewrites a whole expression built by a pass
(``(3 - 0) - 1`` -> ``2``, a select on a constant condition -> its branch); ``nonneg(e, known)`` says whether an integer expression is never
negative (emitters spell ``//`` and ``%`` natively then, and skip ``>= 0`` masks), from the
variables ``known`` to be (``never_negative(kernel)``: block indices, their definitions and
runtime dims; emitters add loop and parallel indices as they enter them). Integer semantics are Python's (``//`` and ``%`` floor); a division
by zero is never folded, and only integer constants (not bools, not floats) are fold operands.
"""
from __future__ import annotations

import operator
from typing import Optional

from . import ir
from .traverse import transform

_B = ir.BinOpKind
_OPS = {_B.ADD: operator.add, _B.SUB: operator.sub, _B.MUL: operator.mul,
        _B.FLOORDIV: operator.floordiv, _B.MOD: operator.mod, _B.AND: operator.and_,
        _B.OR: operator.or_, _B.XOR: operator.xor, _B.SHL: operator.lshift, _B.SHR: operator.rshift,
        _B.LAND: lambda a, b: bool(a and b), _B.LOR: lambda a, b: bool(a or b),
        ir.CmpKind.LT: operator.lt, ir.CmpKind.LE: operator.le, ir.CmpKind.GT: operator.gt,
        ir.CmpKind.GE: operator.ge, ir.CmpKind.EQ: operator.eq, ir.CmpKind.NE: operator.ne}
_FOLDED = (_B.ADD, _B.SUB, _B.MUL, _B.FLOORDIV, _B.MOD, _B.AND, _B.XOR)   # replaced by their value
_UNOPS = {ir.UnOpKind.NEG: operator.neg, ir.UnOpKind.NOT: operator.not_,
          ir.UnOpKind.INVERT: operator.invert}
_CALLS = {ir.MathFn.MIN: min, ir.MathFn.MAX: max, ir.MathFn.ABS: abs}


def _apply(op, a, b):
    """``a op b``; None for a division by zero or an operation without an integer meaning."""
    fn = _OPS.get(op)
    if fn is None or op in (_B.FLOORDIV, _B.MOD) and b == 0:
        return None
    return fn(a, b)


def evaluate(e: ir.Expr, env: Optional[dict] = None) -> Optional[int]:
    """The value of ``e`` when every variable in it is in ``env`` (Var -> int); None when it
    depends on a runtime value (block index, parameter, buffer element) or divides by zero."""
    env = {} if env is None else env
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Var):
        return env.get(e)
    if isinstance(e, (ir.BinOp, ir.Cmp)):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        return None if a is None or b is None else _apply(e.op, a, b)
    if isinstance(e, ir.UnOp):
        a = evaluate(e.a, env)
        return None if a is None else _UNOPS[e.op](a)
    if isinstance(e, ir.Select):
        c = evaluate(e.cond, env)
        return None if c is None else evaluate(e.a if c else e.b, env)
    if isinstance(e, ir.Call) and e.fn in _CALLS:
        args = [evaluate(a, env) for a in e.args]
        return None if None in args else _CALLS[e.fn](*args)
    if isinstance(e, ir.Cast) and not e.dtype.is_float:
        v = evaluate(e.value, env)
        return None if v is None else (bool(v) if e.dtype is ir.DType.BOOL else int(v))
    return None


def fold_binop(op: ir.BinOpKind, a: ir.Expr, b: ir.Expr, dtype: ir.DType,
               loc: ir.Loc) -> Optional[ir.Expr]:
    """``a op b`` (of type ``dtype``) without the operation where that is exact: integer
    constants folded (wrapped to ``dtype`` as the operation would), ``x + 0``, ``x - 0``, ``0 + x``, ``x * 1``, ``1 * x``, ``x // 1``, an
    integer ``x * 0``, and ``and`` / ``or`` with a bool constant (a build-time flag: ``x and
    False`` is False); None to build the operation."""
    x, y = ir.as_int(a), ir.as_int(b)
    if x is not None and y is not None and op in _FOLDED:
        v = _apply(op, x, y)
        if v is not None:
            return ir.Const(dtype.wrap(v) if dtype.is_int else v, dtype, loc)
    if y == 0 and op in (_B.ADD, _B.SUB) or y == 1 and op in (_B.MUL, _B.FLOORDIV):
        return a
    if x == 0 and op is _B.ADD or x == 1 and op is _B.MUL:
        return b
    if op is _B.MUL and 0 in (x, y) and a.dtype.is_int and b.dtype.is_int:
        return ir.Const(0, dtype, loc)
    if op in (_B.LAND, _B.LOR):
        for known, other in ((a, b), (b, a)):
            if isinstance(known, ir.Const) and known.dtype is ir.DType.BOOL:
                # x and True -> x, x and False -> False; x or False -> x, x or True -> True
                decides = bool(known.value) is (op is _B.LOR)
                return ir.Const(bool(known.value), ir.DType.BOOL, loc) if decides else other
    return None


def _fold(e):
    if isinstance(e, ir.BinOp):
        folded = fold_binop(e.op, e.a, e.b, e.dtype, e.loc)
        if folded is not None:
            return folded
        # x + (y + c) -> (x + y) + c: constant offsets outermost, so slot (x + 1) % S reads as
        # one more than slot x % S
        if e.op is _B.ADD and isinstance(e.b, ir.BinOp) and e.b.op is _B.ADD \
                and ir.as_int(e.b.b) is not None:
            inner = ir.BinOp(_B.ADD, e.a, e.b.a, e.dtype, e.loc)
            return ir.BinOp(_B.ADD, inner, e.b.b, e.dtype, e.loc)
    if isinstance(e, ir.Cmp):
        a, b = ir.as_int(e.a), ir.as_int(e.b)
        if a is not None and b is not None:
            return ir.Const(_apply(e.op, a, b), ir.DType.BOOL, e.loc)
    if isinstance(e, ir.Select) and isinstance(e.cond, ir.Const):
        return e.a if e.cond.value else e.b
    return None


def fold(e: ir.Expr) -> ir.Expr:
    return transform(e, _fold)


def shifted(e: ir.Expr, by: int) -> ir.Expr:
    """``e + by``, folded (``e`` itself for 0): a region's start moved along its dim."""
    return e if by == 0 else fold(ir.BinOp(ir.BinOpKind.ADD, e, ir.Const(by, ir.DType.I32, e.loc),
                                           ir.DType.I32, e.loc))


def difference(a: ir.Expr, b: ir.Expr) -> Optional[int]:
    """``a - b`` as an int when it does not depend on runtime values, comparing both as sums of
    integer multiples of the same terms (``(bx + 1) * 64 - bx * 64`` is 64); else None."""
    x, y = linear(a), linear(b)
    if x is None or y is None:
        return None
    terms = set(x) | set(y)
    if any(x.get(t, 0) != y.get(t, 0) for t in terms if t is not None):
        return None
    return x.get(None, 0) - y.get(None, 0)


def linear(e: ir.Expr) -> Optional[dict]:
    """``e`` as {term: coefficient} (the constant under None) for integer sums and products by
    constants; any other subexpression is one term."""
    if not e.dtype.is_int:
        return None
    c = ir.as_int(e)
    if c is not None:
        return {None: c}
    if isinstance(e, ir.BinOp) and e.op in (_B.ADD, _B.SUB, _B.MUL):
        a, b = linear(e.a), linear(e.b)
        if a is None or b is None:
            return None
        if e.op is _B.MUL:
            k, other = (a[None], b) if set(a) == {None} else (b[None], a) if set(b) == {None} else (None, None)
            return None if k is None else {t: k * v for t, v in other.items()}
        sign = 1 if e.op is _B.ADD else -1
        out = dict(a)
        for t, v in b.items():
            out[t] = out.get(t, 0) + sign * v
        return out
    return {e: 1, None: 0}


NONNEG_OPS = (_B.ADD, _B.MUL, _B.FLOORDIV, _B.MOD, _B.AND, _B.OR, _B.SHR)


def never_negative(kernel: ir.Kernel) -> set:
    """The variables of ``kernel`` that are never negative wherever they are bound: block indices,
    their definitions (tile coordinates) and runtime dims."""
    return (set(kernel.block_vars) | {v for v, _ in kernel.block_defs}
            | {d for p in kernel.buffer_params for d in p.shape if isinstance(d, ir.Var)})


def nonneg(e: ir.Expr, known) -> bool:
    """Whether an integer expression is >= 0 by construction, given the variables ``known`` to be
    (unsigned variables are too)."""
    if isinstance(e, ir.Const):
        return e.value >= 0
    if isinstance(e, ir.Var):
        return e in known or e.dtype.record.kind == "uint"
    if isinstance(e, ir.BinOp) and e.op in NONNEG_OPS:
        return nonneg(e.a, known) and nonneg(e.b, known)
    if isinstance(e, ir.BinOp) and e.op is _B.SUB:    # e.g. ceildiv's (K + 31) - ... - 1
        low = _lower_bound(e, known)
        return low is not None and low >= 0
    if isinstance(e, ir.Call) and e.fn in (ir.MathFn.MIN, ir.MathFn.ABS):
        return e.fn is ir.MathFn.ABS or all(nonneg(a, known) for a in e.args)
    if isinstance(e, ir.Call) and e.fn is ir.MathFn.MAX:     # a launch extent clamped at 0
        return any(nonneg(a, known) for a in e.args)
    return False


def interval(e: ir.Expr, ranges: dict) -> Optional[tuple[int, int]]:
    """The smallest and largest value of an integer expression whose variables lie in ``ranges``
    (var -> (lo, hi), inclusive), through sums, differences, products, and floor division and
    remainder by positive constants; None where that is not known."""
    if isinstance(e, ir.Const):
        return (e.value, e.value) if isinstance(e.value, int) and not isinstance(e.value, bool) else None
    if isinstance(e, ir.Var):
        return ranges.get(e)
    if not isinstance(e, ir.BinOp) or not e.dtype.is_int:
        return None
    a = interval(e.a, ranges)
    if a is None:
        return None
    if e.op in (_B.FLOORDIV, _B.MOD):
        c = ir.as_int(e.b)
        if c is None or c <= 0:
            return None
        if e.op is _B.FLOORDIV:
            return a[0] // c, a[1] // c
        return (a[0] % c, a[1] % c) if a[0] // c == a[1] // c else (0, c - 1)
    b = interval(e.b, ranges)
    if b is None:
        return None
    if e.op is _B.ADD:
        return a[0] + b[0], a[1] + b[1]
    if e.op is _B.SUB:
        return a[0] - b[1], a[1] - b[0]
    if e.op is _B.MUL:
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    return None


def loop_range(s: ir.For, ranges: dict) -> Optional[tuple[int, int]]:
    """The values loop ``s``'s variable takes (inclusive), from ``interval`` of its bounds; None
    where they are not known or the step is not a positive constant."""
    low, high = interval(s.start, ranges), interval(s.stop, ranges)
    if low is None or high is None or (ir.as_int(s.step) or 0) <= 0:
        return None
    return low[0], high[1] - 1


def _lower_bound(e: ir.Expr, known) -> Optional[int]:
    """A lower bound of an integer sum or difference whose terms are constants or never negative
    (0 for those), or None."""
    if isinstance(e, ir.Const) and not isinstance(e.value, bool) and isinstance(e.value, int):
        return e.value
    if isinstance(e, ir.BinOp) and e.op in (_B.ADD, _B.SUB):
        a = _lower_bound(e.a, known)
        if e.op is _B.ADD:
            b = _lower_bound(e.b, known)
            return None if a is None or b is None else a + b
        b = ir.as_int(e.b)
        return None if a is None or b is None else a - b
    return 0 if nonneg(e, known) else None
