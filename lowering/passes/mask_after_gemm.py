"""mask_after_gemm: a mask written into a gemm's accumulator before ``C += A B`` is applied to
``C = A B`` after it, so the gemm overwrites its accumulator and nothing branches before it.

TileLang's attention examples start the scores at ``T.if_then_else(mask, 0, -inf)`` and let
``S += Q K^T`` accumulate into them. On the Gluon path, once ``uniform_selects`` has made that
mask a branch, the branch sits at the top of each key block, between the cast of the previous
block's P (the end of its softmax) and the P V wgmma that reads it (issued after this block's
Q K^T, ``overlap_softmax``). LLVM then keeps P as 64 separate halves per thread across the
branch, and ptxas can no longer pack each pair as it converts it: 32 conversions and 32 byte
permutes more per consumer thread and key block (Hopper compile-only, D64 causal: 487
instructions per unmasked block against 423 without a mask; a fifth more issue slots in the
softmax-bound loop). With the mask after the gemm the branch follows the wgmmas, and the cast
moves next to the P V wgmma (``overlap_softmax``): 422.

Requires:  a verified kernel (frontend IR), before ``uniform_selects``.
Ensures:   in every statement list, a ``T.Parallel`` nest directly followed by a ``T.gemm``
           accumulating (not ``clear_accum``, no ``clear_if``) into the whole of a fragment ``C``,
           where the nest is one store ``C[v...] = value`` at its own variables over ``C``'s
           shape and ``value`` is a ``T.if_then_else`` tree whose conditions read no ``C`` and
           whose leaves are the float constants 0, +inf or -inf, becomes the gemm with
           ``clear_accum`` followed by the nest storing ``value`` with each leaf ``x`` replaced
           by ``x + C[v...]`` (0 by ``C[v...]`` alone). Where ``value`` reads no memory, barrier
           waits may separate the nest from the gemm and barrier arrives follow the gemm (an
           explicit program's wait for the gemm's operands and their release): the waits, the
           gemm, the arrives, then the masked nest. A note names the gemms' lines. Anything
           else is unchanged.
Preserves: program meaning: ``0 + sum`` is the sum and ``+-inf + sum`` is ``+-inf`` or NaN
           exactly as ``+-inf`` accumulated term by term is (a gemm's summation order is
           unspecified), except where the terms' own sum overflows, and the sign of a zero sum,
           which the numeric contract leaves open (design.md §3); the conditions read nothing
           the gemm writes, so they have the same values after it; a nest moved across barrier
           waits and arrives reads no memory and writes only its own fragment, so no barrier
           orders anything it touches. Locations.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .. import ir
from ..config import BackendConfig
from ..traverse import rewrite_pairs, subexprs, transform, whole_store


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    lines: list[int] = []
    body, more = rewrite_pairs(transform(kernel.body, lambda n: _around_barriers(n, lines)), _moved)
    return kernel.rewritten(body, lines + more,
                            "mask_after_gemm: the T.gemm at line {lines} overwrites its accumulator "
                            "and the mask written into it before is applied to its result")


def _around_barriers(node, lines: list[int]) -> Optional[ir.Seq]:
    """In a statement list, a mask nest of a gemm's accumulator whose value reads no memory,
    separated from the gemm by barrier waits or followed by it and then barrier arrives (an
    explicit program's wait for the gemm's operands and release of them): the waits, the gemm
    overwriting its accumulator, the arrives, then the masked nest (``lines``: each gemm's);
    None where there is none."""
    if not isinstance(node, ir.Seq):
        return None
    stmts, changed, i = list(node.stmts), False, 0
    while i < len(stmts):
        g = i + 1
        while g < len(stmts) and isinstance(stmts[g], ir.BarrierWait):
            g += 1
        end = g + 1
        while end < len(stmts) and isinstance(stmts[end], ir.BarrierArrive):
            end += 1
        moved = _moved(stmts[i], stmts[g]) if g < len(stmts) and end > i + 2 else None
        if moved is None or any(isinstance(e, ir.Load) for e in subexprs(whole_store(stmts[i]).value)):
            i += 1
            continue
        gemm, masked = moved
        stmts[i:end] = [*stmts[i + 1:g], gemm, *stmts[g + 1:end], masked]
        lines.append(gemm.loc.line)
        changed = True
        i = end
    return dataclasses.replace(node, stmts=tuple(stmts)) if changed else None


def _moved(nest: ir.Stmt, gemm: ir.Stmt) -> Optional[list[ir.Stmt]]:
    """[the gemm overwriting C, the nest masking its result], or None where the pair is no mask
    of the gemm's accumulator (module docstring)."""
    store = whole_store(nest)
    if not (store is not None and isinstance(gemm, ir.Gemm) and not gemm.may_clear
            and gemm.c.is_whole and gemm.c.buffer.scope is ir.Scope.FRAGMENT):
        return None
    c = gemm.c.buffer
    if not (store.buffer == c and _absorbing(store.value, c)):
        return None
    value = _onto(store.value, ir.Load(c, store.indices, store.loc))
    masked = dataclasses.replace(nest, body=dataclasses.replace(
        nest.body, stmts=(dataclasses.replace(store, value=value),)))
    return [dataclasses.replace(gemm, clear_accum=True), masked]


def _onto(value: ir.Expr, here: ir.Load) -> ir.Expr:
    """``value`` with each constant leaf ``x`` replaced by ``x + here`` (0 by ``here``)."""
    if isinstance(value, ir.Select):
        return dataclasses.replace(value, a=_onto(value.a, here), b=_onto(value.b, here))
    return here if _constant(value) == 0 else ir.BinOp(ir.BinOpKind.ADD, value, here, value.dtype, value.loc)


def _absorbing(value: ir.Expr, c: ir.Buffer) -> bool:
    """Whether ``value`` is a ``T.if_then_else`` tree whose conditions read no ``c`` and whose
    leaves are the float constants 0, +inf or -inf."""
    if isinstance(value, ir.Select):
        return (not any(isinstance(e, ir.Load) and e.buffer == c for e in subexprs(value.cond))
                and _absorbing(value.a, c) and _absorbing(value.b, c))
    x = _constant(value)
    return x is not None and (x == 0 or math.isinf(x))


def _constant(e: ir.Expr) -> Optional[float]:
    """The value of a float constant or a negated one (``-T.infinity(...)``), else None."""
    if isinstance(e, ir.UnOp) and e.op is ir.UnOpKind.NEG:
        x = _constant(e.a)
        return None if x is None else -x
    return float(e.value) if isinstance(e, ir.Const) and e.dtype.is_float else None
