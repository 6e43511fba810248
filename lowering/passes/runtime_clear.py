"""runtime_clear: a branch that zeroes a gemm's accumulator just before the gemm becomes the
gemm's run-time choice to overwrite it (wgmma's ``use_acc`` operand) instead of zeroing registers.

TileLang's attention examples start the scores at ``T.if_then_else(mask, 0, -inf)`` and let
``S += Q K^T`` accumulate into them; ``uniform_selects`` turns the blocks where the mask is the
same everywhere into ``if <unmasked>: S = 0 else: <mask>`` (every key block of a non-causal
program but a ragged last one; the blocks below the diagonal of a causal one), and
``tilews.ops.attention`` writes the causal form by hand (``T.clear(acc_s)``). Each such block then
moves zeros into the accumulator's registers (64 per consumer thread at 128 key columns) and
makes the wgmma wait for them; the op's non-causal program instead writes ``S = Q K^T``
(``clear_accum``) and masks after. Triton's own accumulator-init rewrite does not run on Gluon
modules.
In Gluon's pipeline ``mask_after_gemm`` runs first and moves a whole-tile 0 / +-inf start
after the gemm (``clear_accum``); what reaches this pass is an explicit branch such as ``if c:
T.clear(S) else: <mask>``, or a start of another form.

Requires:  a verified kernel, before ``plan_pipeline`` (in Gluon's pipeline, after
           ``uniform_selects`` made the branches and ``split_extents`` cut the tiles).
Ensures:   in every statement list, an ``If`` directly followed by a ``T.gemm`` accumulating
           into the whole of an on-chip buffer ``C`` (not ``clear_accum``, no ``clear_if``),
           where some branches of the ``If`` — looking through nested ``If``s whose conditions
           read no buffer and whose branches hold one statement each — are only a fill of ``C``
           with 0 (``T.fill`` / ``T.clear``, or a ``T.Parallel`` nest over ``C``'s shape storing
           0 at its own element): those fills go (an ``If`` left with an empty ``then`` tests the
           negated condition; one left empty goes), and the gemm gets ``clear_if`` = the
           condition under which one of them ran (``C = A B`` there at run time), or
           ``clear_accum`` where that condition folds to true. A note names the gemms' lines.
           Anything else is unchanged.
Preserves: program meaning: where the condition holds, ``0 + A B`` and ``A B`` are the same
           numbers (the sign of a zero sum aside, which the numeric contract leaves open,
           design.md §3), and elsewhere nothing changed; the conditions read no buffer and the
           gemm directly follows them, so they have the same values at the gemm. Locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..config import BackendConfig
from ..simplify import fold
from ..traverse import rewrite_pairs, subexprs, whole_store


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    return kernel.rewritten(*rewrite_pairs(kernel.body, _folded),
                            "runtime_clear: the T.gemm at line {lines} overwrites its accumulator "
                            "(wgmma use_acc off) where the branch before it would have filled it "
                            "with zeros")


def _folded(branch: ir.Stmt, gemm: ir.Stmt) -> Optional[list[ir.Stmt]]:
    """[the branch less its zero fills (if anything is left), the gemm overwriting C where they
    ran], or None where the pair is no branch zeroing the gemm's whole accumulator."""
    if not (isinstance(branch, ir.If) and isinstance(gemm, ir.Gemm) and not gemm.may_clear
            and gemm.c.is_whole):
        return None
    cleared, rest = _without_zero_fills(branch, gemm.c.buffer)
    if cleared is None:
        return None
    cond = fold(cleared)
    if isinstance(cond, ir.Const):
        if not cond.value:
            return None
        gemm = dataclasses.replace(gemm, clear_accum=True)
    else:
        gemm = dataclasses.replace(gemm, clear_if=cleared)
    return ([] if rest is None else [rest]) + [gemm]


def _without_zero_fills(s: ir.Stmt, buffer: ir.Buffer) -> tuple:
    """(the condition under which ``s`` fills ``buffer`` whole with 0, or None where it never
    does; ``s`` less those fills, or None where nothing is left). Looks through ``If``s whose
    conditions read no buffer and whose branches hold one statement each."""
    if _zero_fill_of(s) == buffer:
        return ir.Const(True, ir.DType.BOOL, s.loc), None
    branches = (s.then.stmts, s.orelse.stmts) if isinstance(s, ir.If) else ()
    if (not branches or any(len(b) > 1 for b in branches)
            or any(isinstance(e, ir.Load) for e in subexprs(s.cond))):
        return None, s
    (when_then, then), (when_else, orelse) = (
        _without_zero_fills(b[0], buffer) if b else (None, None) for b in branches)
    if when_then is None and when_else is None:
        return None, s
    loc = s.cond.loc
    unless = ir.UnOp(ir.UnOpKind.NOT, s.cond, ir.DType.BOOL, loc)
    both = lambda a, b: ir.BinOp(ir.BinOpKind.LAND, a, b, ir.DType.BOOL, loc)  # noqa: E731
    parts = [both(c, w) for c, w in ((s.cond, when_then), (unless, when_else)) if w is not None]
    cond = parts[0] if len(parts) == 1 else ir.BinOp(ir.BinOpKind.LOR, *parts, ir.DType.BOOL, loc)
    seq = lambda x: ir.Seq(() if x is None else (x,), s.loc)  # noqa: E731
    if then is None and orelse is None:
        return cond, None
    if then is None:
        return cond, ir.If(unless, seq(orelse), seq(None), s.loc)
    return cond, ir.If(s.cond, seq(then), seq(orelse), s.loc)


def _zero_fill_of(s: ir.Stmt) -> Optional[ir.Buffer]:
    """The on-chip buffer ``s`` fills whole with 0, else None."""
    store = whole_store(s)
    if isinstance(s, ir.Fill):
        whole, buffer, value = s.dst.is_whole, s.dst.buffer, s.value
    elif store is not None:
        whole, buffer, value = True, store.buffer, store.value
    else:
        return None
    zero = isinstance(value, ir.Const) and value.value == 0
    on_chip = buffer.scope in (ir.Scope.FRAGMENT, ir.Scope.SHARED)
    return buffer if whole and zero and on_chip else None
