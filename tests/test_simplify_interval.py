"""``simplify.interval``: the value range of integer index expressions, which lets the tl emitter
drop bounds checks an index cannot fail (per-thread GEMV loads: unmasked 128-bit loads)."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.simplify import interval

I32 = ir.DType.I32


def var(name):
    return ir.Var(name, I32, ir.VarKind.LOOP)


def c(v):
    return ir.Const(v, I32)


def op(kind, a, b):
    return ir.BinOp(kind, a, b, I32)


B = ir.BinOpKind


def test_sums_products_floor_division_and_remainder():
    bk, tk, k = var("bk"), var("tk"), var("k")
    ranges = {bk: (0, 15), tk: (0, 31), k: (0, 7)}
    index = op(B.ADD, op(B.ADD, op(B.MUL, bk, c(256)), op(B.MUL, tk, c(8))), k)
    assert interval(index, ranges) == (0, 4095)            # < 4096: no mask needed
    assert interval(op(B.SUB, c(10), tk), ranges) == (-21, 10)
    assert interval(op(B.MUL, op(B.SUB, tk, c(16)), op(B.SUB, k, c(3))), ranges) == (-64, 60)
    assert interval(op(B.FLOORDIV, index, c(64)), ranges) == (0, 63)
    assert interval(op(B.MOD, index, c(64)), ranges) == (0, 63)
    assert interval(op(B.MOD, k, c(64)), ranges) == (0, 7)  # one period: the values themselves


def test_unknown_where_a_variable_or_operation_is_not_known():
    bk, n = var("bk"), var("n")
    assert interval(op(B.ADD, bk, n), {bk: (0, 3)}) is None
    assert interval(op(B.FLOORDIV, bk, n), {bk: (0, 3), n: (1, 4)}) is None
    assert interval(op(B.MOD, bk, c(0)), {bk: (0, 3)}) is None
