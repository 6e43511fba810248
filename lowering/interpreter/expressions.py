"""Vectorized evaluation of ``ir.Expr`` trees with numpy.

Contract:
* An expression is evaluated over the lanes of an iteration space: one lane outside
  ``T.Parallel``; inside, each parallel ``Var`` is bound (in ``env``) to a broadcastable
  ``np.arange`` and values broadcast to the parallel extents.
* ``mask`` (None: every lane) marks the lanes that run. Loads touch memory only at active lanes, so
  a guarded out-of-bounds or never-written element is not read; ``Select`` narrows the mask for
  each arm. Inactive lanes hold unspecified values.
* Each result is rounded to its node's dtype (``values.Numerics.round``); integer ``//`` and ``%``
  follow Python (floor) semantics; float ``//`` is the floor of the rounded quotient and float
  ``%`` Python's (the exact remainder, given the divisor's sign); math functions are computed in
  float64 and rounded once; ``max``/``min`` propagate NaN; a ``Bitcast`` views the value's storage bits as the new dtype.
* Loads go through ``memory.Memory.gather`` (bounds, initialization and race checks).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import ir
from .memory import Memory
from .values import F64, Numerics, storage, to_storage

_BINARY = {ir.BinOpKind.ADD: np.add, ir.BinOpKind.SUB: np.subtract, ir.BinOpKind.MUL: np.multiply,
           ir.BinOpKind.DIV: np.true_divide, ir.BinOpKind.FLOORDIV: np.floor_divide,
           ir.BinOpKind.MOD: np.mod, ir.BinOpKind.AND: np.bitwise_and,
           ir.BinOpKind.OR: np.bitwise_or, ir.BinOpKind.XOR: np.bitwise_xor,
           ir.BinOpKind.SHL: np.left_shift, ir.BinOpKind.SHR: np.right_shift,
           ir.BinOpKind.LAND: np.logical_and, ir.BinOpKind.LOR: np.logical_or}
_COMPARE = {ir.CmpKind.LT: np.less, ir.CmpKind.LE: np.less_equal, ir.CmpKind.GT: np.greater,
            ir.CmpKind.GE: np.greater_equal, ir.CmpKind.EQ: np.equal, ir.CmpKind.NE: np.not_equal}
_FLOAT_FNS = {ir.MathFn.EXP: np.exp, ir.MathFn.EXP2: np.exp2, ir.MathFn.LOG: np.log,
              ir.MathFn.LOG2: np.log2, ir.MathFn.SQRT: np.sqrt,
              ir.MathFn.RSQRT: lambda x: 1.0 / np.sqrt(x), ir.MathFn.CEIL: np.ceil}


def both(mask: Optional[np.ndarray], cond) -> np.ndarray:
    """The lanes active under ``mask`` where ``cond`` holds."""
    cond = np.asarray(cond, dtype=bool)
    return cond if mask is None else mask & cond


class Evaluator:
    def __init__(self, memory: Optional[Memory], numerics: Numerics):
        self.mem = memory
        self.num = numerics
        self._rules = {ir.Const: self._const, ir.Var: self._var, ir.BinOp: self._binop,
                       ir.Cmp: self._cmp, ir.UnOp: self._unop, ir.Call: self._call,
                       ir.Cast: self._cast, ir.Bitcast: self._bitcast, ir.Select: self._select, ir.Load: self._load}

    def eval(self, e: ir.Expr, env: dict, mask: Optional[np.ndarray] = None):
        return self._rules[type(e)](e, env, mask)

    def index(self, e: ir.Expr, env: dict) -> int:
        """A scalar integer expression (region starts, loop bounds, barrier indices)."""
        return int(self.eval(e, env))

    def _const(self, e: ir.Const, env, mask):
        return np.asarray(e.value, dtype=self.num.value(e.dtype))

    def _var(self, e: ir.Var, env, mask):
        try:
            return env[e]
        except KeyError:
            raise RuntimeError(f"{e.loc}: internal: '{e.name}' is not bound here") from None

    def _binop(self, e: ir.BinOp, env, mask):
        vt = self.num.value(e.dtype)
        a = np.asarray(self.eval(e.a, env, mask)).astype(vt)
        b = np.asarray(self.eval(e.b, env, mask)).astype(vt)
        if e.op is ir.BinOpKind.FLOORDIV and e.dtype.is_float:    # floor of the rounded quotient
            return self.num.round(np.floor(self.num.round(np.true_divide(a, b), e.dtype)), e.dtype)
        return self.num.round(_BINARY[e.op](a, b), e.dtype)

    def _cmp(self, e: ir.Cmp, env, mask):
        a, b = np.asarray(self.eval(e.a, env, mask)), np.asarray(self.eval(e.b, env, mask))
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            a, b = a.astype(F64), b.astype(F64)
        return _COMPARE[e.op](a, b)

    def _unop(self, e: ir.UnOp, env, mask):
        a = np.asarray(self.eval(e.a, env, mask))
        if e.op is ir.UnOpKind.NOT or (e.op is ir.UnOpKind.INVERT and a.dtype.kind == "b"):
            return np.logical_not(a)
        return self.num.round(-a if e.op is ir.UnOpKind.NEG else ~a, e.dtype)

    def _call(self, e: ir.Call, env, mask):
        args = [np.asarray(self.eval(a, env, mask)) for a in e.args]
        if e.fn is ir.MathFn.MAX or e.fn is ir.MathFn.MIN:
            fn = np.maximum if e.fn is ir.MathFn.MAX else np.minimum
            out = args[0]
            for a in args[1:]:
                out = fn(out, a)
        elif e.fn is ir.MathFn.ABS:
            out = np.abs(args[0])
        else:
            out = _FLOAT_FNS[e.fn](args[0].astype(F64))
        return self.num.round(out, e.dtype)

    def _cast(self, e: ir.Cast, env, mask):
        return self.num.cast(self.eval(e.value, env, mask), e.dtype)

    def _bitcast(self, e: ir.Bitcast, env, mask):
        bits = to_storage(self.eval(e.value, env, mask), storage(e.value.dtype))
        return bits.view(storage(e.dtype)).astype(self.num.value(e.dtype))

    def _select(self, e: ir.Select, env, mask):
        cond = np.asarray(self.eval(e.cond, env, mask), dtype=bool)
        vt = self.num.value(e.dtype)
        a = np.asarray(self.eval(e.a, env, both(mask, cond))).astype(vt)
        b = np.asarray(self.eval(e.b, env, both(mask, ~cond))).astype(vt)
        return np.where(cond, a, b)

    def _load(self, e: ir.Load, env, mask):
        idx = [self.eval(i, env, mask) for i in e.indices]
        return self.mem.gather(e.buffer, idx, mask, e.loc)
