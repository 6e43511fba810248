"""fold_zero_fill: a wgmma accumulator zeroed on one side of a branch is not zeroed at all — the
gemm is told at run time whether to add into it.

TileLang's attention writes S as ``if unmasked: clear(S) else: S = mask (0 / -inf)`` and then
accumulates Q K^T into S. Zeroing S costs one register move per element in every block, as many
instructions as the softmax's exponentials; a wgmma that does not add its accumulator
(``use_acc`` false) needs no zeros.

Requires:  legalize_wgmma has decided the gemm instructions (only ``WGMMA`` gemms are rewritten).
Ensures:   in every statement list, ``if c: T else: E`` followed, with nothing between but barrier
           waits, by a ``WGMMA`` gemm into X that adds into X (not ``clear_accum``), where one
           branch is exactly ``fill X = 0`` over all of X, nothing between touches X, and ``c``
           reads no memory, becomes the other branch under its own condition (``not c`` when the
           fill was ``T``; no ``if`` when that branch is empty) and the gemm with
           ``accumulate_if`` = the condition under which the other branch runs: where it is false
           the gemm writes X without reading it, which equals adding into zeros.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..plans import AsyncPlan
from ..target import Target
from ..traverse import buffers_read, buffers_written, rewrite, subexprs, walk


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    if not target.wgmma or kernel.find_plan(AsyncPlan) is None:
        return kernel
    folded: list[ir.Gemm] = []

    def fn(s: ir.Stmt) -> Optional[ir.Stmt]:
        if isinstance(s, (ir.For, ir.Role)):
            return dataclasses.replace(s, body=_fold(s.body, folded))
        if isinstance(s, ir.If):
            return dataclasses.replace(s, then=_fold(s.then, folded), orelse=_fold(s.orelse, folded))
        return None
    body = rewrite(kernel.body, fn)
    if not folded:
        return kernel
    lines = ", ".join(sorted({str(g.loc.line) for g in folded}))
    return dataclasses.replace(kernel, body=body).with_note(
        f"fold_zero_fill: the gemm at line(s) {lines} adds into its accumulator only where it was "
        f"not zeroed (use_acc at run time), so the accumulator is never zeroed")


def _fold(seq: ir.Seq, folded: list) -> ir.Seq:
    out: list[ir.Stmt] = []
    stmts = list(seq.stmts)
    for k, s in enumerate(stmts):
        g = next((j for j in range(k + 1, len(stmts)) if not isinstance(stmts[j], ir.BarrierWait)), None)
        if not isinstance(s, ir.If) or g is None or not _folds(s, stmts[g], stmts[k + 1:g]):
            out.append(s)
            continue
        gemm = stmts[g]
        if _zero_fill(s.then.stmts, gemm.c):
            other, cond = s.orelse, ir.UnOp(ir.UnOpKind.NOT, s.cond, ir.DType.BOOL, s.loc)
        else:
            other, cond = s.then, s.cond
        if other.stmts:
            out.append(ir.If(cond, other, ir.Seq((), s.loc), s.loc))
        stmts[g] = dataclasses.replace(gemm, accumulate_if=cond)
        folded.append(gemm)
    return dataclasses.replace(seq, stmts=tuple(out))


def _folds(branch: ir.If, gemm: ir.Stmt, between: list) -> bool:
    if not (isinstance(gemm, ir.Gemm) and gemm.instr is ir.GemmInstr.WGMMA and not gemm.clear_accum
            and gemm.accumulate_if is None and gemm.c.is_whole):
        return False
    if not (_zero_fill(branch.then.stmts, gemm.c) or _zero_fill(branch.orelse.stmts, gemm.c)):
        return False
    if any(isinstance(x, ir.Load) for x in subexprs(branch.cond)):
        return False
    x = gemm.c.buffer
    return not any(x in buffers_read(t) + buffers_written(t) for s in between for t in walk(s))


def _zero_fill(stmts: tuple, c: ir.Region) -> bool:
    """``stmts`` is exactly ``fill c = 0`` over the whole accumulator."""
    return (len(stmts) == 1 and isinstance(stmts[0], ir.Fill) and stmts[0].dst.buffer == c.buffer
            and stmts[0].dst.is_whole and isinstance(stmts[0].value, ir.Const) and stmts[0].value.value == 0)
