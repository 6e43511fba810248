"""uniform_selects: a ``T.Parallel`` nest whose ``T.if_then_else`` condition is the same at every
element in some iterations runs as a scalar branch there, without the per-element compare.

Causal attention initialises its scores with ``T.if_then_else(bx*bM + i >= k*bN + j, 0, -inf)``
on every key block; the condition holds for the whole tile on every block below the diagonal (all
but the last one or two of each row of blocks), so those blocks need no mask. On the Gluon path
the mask costs each consumer thread 32 compares and selects per block, a fifth of its fragment
math: H100, TileLang's causal D192 attention 1.07x TileLang's own kernel with the mask on every
block, 0.85x with it only where it cuts (D128 causal 1.07x -> 0.81x).

Requires:  a verified kernel (frontend IR; any backend).
Ensures:   A *uniform comparison* of a ``T.Parallel`` nest compares (``<``, ``<=``, ``>``,
           ``>=``) two integer expressions whose difference is a sum of constant multiples of
           the nest's variables plus a rest that reads no nest variable and no buffer (loop and
           block indices, runtime scalars, constants), with at least one nest variable; a
           *uniform condition* is the condition of a ``Select`` in its body that is one, or an
           ``and`` of them (an explicit program's causal mask and its key-length bound). The nest
           with the first such condition (in pre-order) becomes ``if <it holds at every element>:
           <nest, those selects -> their true value> else: if <it fails at every element>: <nest, ->
           false value> else: <nest as written>``; the two scalar tests are each comparison at the
           extremes of its difference over the nest's box (each variable at 0 or its extent - 1, by
           the sign of its coefficient): an ``and`` holds everywhere where each of its comparisons
           does, and fails everywhere where one of them does. A branch's stores that write back the
           element they read (``acc[i, j] = T.if_then_else(c, acc[i, j], -inf)`` where ``c`` holds)
           are dropped. A note names the nests' lines. Anything else is unchanged.
Preserves: program meaning (each element takes the value it took: the branch taken is the one
           the element's own condition selects) and locations (the branches carry the nest's).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..config import BackendConfig
from ..simplify import fold, linear
from ..traverse import exprs_of, footprint, rewrite, subexprs, transform, walk

_FLIP = {ir.CmpKind.GE: False, ir.CmpKind.GT: False, ir.CmpKind.LE: True, ir.CmpKind.LT: True}
_NEGATION = {ir.CmpKind.GE: ir.CmpKind.LT, ir.CmpKind.GT: ir.CmpKind.LE,
             ir.CmpKind.LE: ir.CmpKind.GT, ir.CmpKind.LT: ir.CmpKind.GE}


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    lines: list[int] = []
    written = frozenset(footprint(kernel.body)[1])

    def branch(s: ir.Stmt) -> Optional[ir.Stmt]:
        if not isinstance(s, ir.Parallel):
            return None
        cond = _uniform_condition(s, written)
        if cond is None:
            return None
        lines.append(s.loc.line)
        return _branched(s, cond, written)

    return kernel.rewritten(rewrite(kernel.body, branch, opaque=(ir.If,)), lines,
                            "uniform_selects: the T.Parallel loop at line {lines} runs unmasked (one "
                            "value for the whole tile) where its T.if_then_else condition is the "
                            "same at every element")


def _uniform_condition(par: ir.Parallel, written: frozenset) -> Optional[ir.Expr]:
    for s in walk(par.body):
        for e in (x for top in exprs_of(s) for x in subexprs(top)):
            if isinstance(e, ir.Select) and _conjuncts(e.cond, par, written) is not None:
                return e.cond
    return None


def _conjuncts(cond: ir.Expr, par: ir.Parallel, written: frozenset) -> Optional[list[ir.Cmp]]:
    """The comparisons ``cond`` is the conjunction of (itself, or the operands of its ``and``s),
    where each is a uniform comparison of ``par`` (``_extremes``); else None."""
    if isinstance(cond, ir.BinOp) and cond.op is ir.BinOpKind.LAND:
        a, b = _conjuncts(cond.a, par, written), _conjuncts(cond.b, par, written)
        return None if a is None or b is None else a + b
    return [cond] if _extremes(cond, par, written) is not None else None


def _extremes(cond: ir.Expr, par: ir.Parallel, written: frozenset):
    """(least, greatest) of ``cond``'s ``a - b`` over ``par``'s box as expressions, or None where
    ``cond`` is no uniform condition of ``par``."""
    if not (isinstance(cond, ir.Cmp) and cond.op in _FLIP and cond.a.dtype.is_int
            and cond.b.dtype.is_int):
        return None
    diff = ir.BinOp(ir.BinOpKind.SUB, cond.a, cond.b, ir.DType.I32, cond.loc)
    terms = linear(diff)
    if terms is None:
        return None
    inner = set(par.vars)
    coeffs = {v: terms.get(v, 0) for v in par.vars}
    for t in terms:
        if t is None or t in inner:
            continue
        if any(isinstance(x, ir.Load) and x.buffer in written or x in inner for x in subexprs(t)):
            return None
    if not any(coeffs.values()):
        return None
    at_zero = fold(transform(diff, lambda n: ir.Const(0, ir.DType.I32, n.loc) if n in inner else None))
    low = sum(c * (n - 1) for c, n in zip(coeffs.values(), par.extents) if c < 0)
    high = sum(c * (n - 1) for c, n in zip(coeffs.values(), par.extents) if c > 0)
    shift = lambda k: fold(ir.BinOp(ir.BinOpKind.ADD, at_zero, ir.Const(k, ir.DType.I32, cond.loc),  # noqa: E731
                                    ir.DType.I32, cond.loc))
    return shift(low), shift(high)


def _branched(par: ir.Parallel, cond: ir.Expr, written: frozenset) -> ir.If:
    """The branches on ``cond``: it holds at every element where each of its conjuncts does, and
    fails at every element where one of them does."""
    tests = [_everywhere_nowhere(c, par, written) for c in _conjuncts(cond, par, written)]
    everywhere, nowhere = tests[0]
    for e, n in tests[1:]:
        everywhere = ir.BinOp(ir.BinOpKind.LAND, everywhere, e, ir.DType.BOOL, cond.loc)
        nowhere = ir.BinOp(ir.BinOpKind.LOR, nowhere, n, ir.DType.BOOL, cond.loc)
    seq = lambda *s: ir.Seq(tuple(s), par.loc)  # noqa: E731
    return ir.If(everywhere, seq(*_decided(par, cond, True)),
                 seq(ir.If(nowhere, seq(*_decided(par, cond, False)), seq(par), par.loc)), par.loc)


def _everywhere_nowhere(cond: ir.Cmp, par: ir.Parallel, written: frozenset) -> tuple[ir.Cmp, ir.Cmp]:
    """Scalar tests that comparison ``cond`` holds at every element of ``par``'s box, and that it
    fails at every one: its ``a - b`` at the extreme where it is hardest to hold, and where it is
    easiest."""
    least, greatest = _extremes(cond, par, written)
    if _FLIP[cond.op]:      # a - b <= 0 (or < 0): it holds everywhere at its greatest
        least, greatest = greatest, least
    zero = ir.Const(0, ir.DType.I32, cond.loc)
    return ir.Cmp(cond.op, least, zero, cond.loc), ir.Cmp(_NEGATION[cond.op], greatest, zero, cond.loc)


def _decided(par: ir.Parallel, cond: ir.Expr, holds: bool) -> tuple[ir.Stmt, ...]:
    """``par`` with the selects on ``cond`` replaced by the value ``holds`` picks; () where every
    store then writes back the element it read."""
    body = transform(par.body, lambda n: (n.a if holds else n.b)
                     if isinstance(n, ir.Select) and n.cond == cond else None)
    kept = tuple(s for s in body.stmts if not _writes_back(s))
    return (dataclasses.replace(par, body=dataclasses.replace(body, stmts=kept)),) if kept else ()


def _writes_back(s: ir.Stmt) -> bool:
    return (isinstance(s, ir.Store) and isinstance(s.value, ir.Load) and s.value.buffer == s.buffer
            and s.value.indices == s.indices)
