"""Integer constant folding for expressions built by passes (``(3 - 0) - 1`` -> ``2``)."""
from __future__ import annotations

import operator

from . import ir
from .traverse import transform

_INT_OPS = {ir.BinOpKind.ADD: operator.add, ir.BinOpKind.SUB: operator.sub,
            ir.BinOpKind.MUL: operator.mul, ir.BinOpKind.FLOORDIV: operator.floordiv,
            ir.BinOpKind.MOD: operator.mod, ir.BinOpKind.AND: operator.and_,
            ir.BinOpKind.XOR: operator.xor}
_CMPS = {ir.CmpKind.LT: operator.lt, ir.CmpKind.LE: operator.le, ir.CmpKind.GT: operator.gt,
         ir.CmpKind.GE: operator.ge, ir.CmpKind.EQ: operator.eq, ir.CmpKind.NE: operator.ne}


def _fold(e):
    if isinstance(e, ir.BinOp) and e.op in _INT_OPS:
        a, b = ir.as_int(e.a), ir.as_int(e.b)
        if a is not None and b is not None and not (b == 0 and e.op in (ir.BinOpKind.FLOORDIV, ir.BinOpKind.MOD)):
            return ir.Const(_INT_OPS[e.op](a, b), e.dtype, e.loc)
        if b == 0 and e.op in (ir.BinOpKind.ADD, ir.BinOpKind.SUB) or \
                b == 1 and e.op in (ir.BinOpKind.MUL, ir.BinOpKind.FLOORDIV):
            return e.a
        if a == 0 and e.op is ir.BinOpKind.ADD or a == 1 and e.op is ir.BinOpKind.MUL:
            return e.b
        # x + (y + c) -> (x + y) + c: constant offsets outermost, so slot (x + 1) % S reads as
        # one more than slot x % S
        if e.op is ir.BinOpKind.ADD and isinstance(e.b, ir.BinOp) and e.b.op is ir.BinOpKind.ADD \
                and ir.as_int(e.b.b) is not None:
            inner = ir.BinOp(ir.BinOpKind.ADD, e.a, e.b.a, e.dtype, e.loc)
            return ir.BinOp(ir.BinOpKind.ADD, inner, e.b.b, e.dtype, e.loc)
    if isinstance(e, ir.Cmp):
        a, b = ir.as_int(e.a), ir.as_int(e.b)
        if a is not None and b is not None:
            return ir.Const(_CMPS[e.op](a, b), ir.DType.BOOL, e.loc)
    return None


def fold(e: ir.Expr) -> ir.Expr:
    return transform(e, _fold)
