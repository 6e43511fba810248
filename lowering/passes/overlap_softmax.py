"""overlap_softmax: keep a block's gemms on the tensor cores while the warp group does fragment
math — FlashAttention-3's intra-warp-group overlap.

Requires:  legalize_wgmma made an ``AsyncPlan``; warp_specialize gave each group of ring buffers
           its own full/empty pair, waited right before its first reader and released right after
           its last (attention: K before Q K^T, V before P V).
Ensures:   when ``config.policy.overlap_softmax`` (on for Hopper; the
           ``TILEWS_OVERLAP_SOFTMAX=off`` switch turns it off), a role loop
           ``for k in serial(start, stop, step)`` (step a positive constant) whose body is

               H(k); barrier_wait R[k]; gemm -> X [wgmma]; gemm_wait 0; barrier_arrive E[k];
               M(k);
               barrier_wait R2[k]; gemm G2 [wgmma]; gemm_wait 0; barrier_arrive E2[k]

           (each gemm may be a run of consecutive gemms: the pieces split_extents made of one,
           e.g. head dim 192's two Q K^T gemms into S and two P V gemms into two output pieces;
           ``gemm_wait 1`` below then waits for all but the second run's gemms)

           where ``H`` (the head: a mask into X) holds no barrier or gemm, X is not among what G2
           reads or writes, H and the first gemm read nothing G2 writes, and M = M1 M2 with M1 the
           longest prefix of M touching nothing G2 reads or writes (the softmax statistics) and
           M2 the rest (P = cast S, the output's rescale), becomes

               [if start < stop:] H(start) ... barrier_arrive E[start]; M1(start) W(start)
               for k in serial(start, stop - step, step):       # k: the previous block
                   P(k)
                   H(k + step); barrier_wait R[k + step]; gemm -> X
                   barrier_wait R2[k]; G2(k)
                   gemm_wait 1; barrier_arrive E[k + step]; M1(k + step)
                   gemm_wait 0; barrier_arrive E2[k]; W(k + step)
               [if start < stop:] P(last); barrier_wait R2[last]; G2(last); gemm_wait 0; barrier_arrive E2[last]

           where P is the statements of M2 that write what G2 reads (attention's cast S -> P,
           and the output's rescale: G2 accumulates into the output) and W the rest, provided
           P reads nothing W writes and W touches nothing P writes; otherwise P is empty and W
           is M2. P then runs right before
           the gemm reading it, with no branch between (a branch in H aside): LLVM keeps P's
           16-bit halves in the block that converts them, and ptxas packs each pair as it
           converts it (Hopper compile-only, D64 attention: 32 conversions and 32 byte permutes
           fewer per consumer thread and key block than with P at the end of the iteration, the
           halves then carried around the loop).

           A loop whose ring slots follow a counter its body increments last (its trip count
           varies from tile to tile) keeps the increment last; the current block's slots are
           the counter's value plus 1, and the peeled last ``G2`` is followed by the last
           block's increment. Loops inside a persistent tile loop are rewritten alike.
           In program order this only moves G2 of block k - 1 after the head and first gemm of
           block k, which touch nothing it touches, and P of block k after W of block k, which
           commute; on the GPU, P V of block k - 1 runs while M1 (the softmax of block k) runs,
           and W waits for it. wgmma groups complete in order, so
           ``gemm_wait 1`` completes the first gemm. Every gemm issued in an iteration is waited
           for in it (Gluon carries only completed accumulators through loops); the loop carries
           the scores X (P's source) and the output.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, schedule
from ..plans import AsyncPlan
from ..simplify import fold
from ..config import BackendConfig
from ..traverse import footprint, touched, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if not config.policy.overlap_softmax or kernel.find_plan(AsyncPlan) is None:
        return kernel
    deferred: list[ir.For] = []
    stmts = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.WarpSpecialize):
            s = dataclasses.replace(s, roles=tuple(dataclasses.replace(r, body=_body(r.body, deferred))
                                                   for r in s.roles))
        stmts.append(s)
    if not deferred:
        return kernel
    return dataclasses.replace(kernel, body=ir.Seq(tuple(stmts), kernel.body.loc)).with_note(
        f"overlap_softmax: in the loop at line {deferred[0].loc.line}, block k's first gemm and "
        f"block k - 1's second are issued together; block k's fragment math runs while the "
        f"second is in flight")


def _body(body: ir.Seq, deferred: list) -> ir.Seq:
    """``body`` with its loops rewritten, those inside a persistent tile loop included."""
    out = []
    for s in body.stmts:
        if isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT:
            out.append(dataclasses.replace(s, body=_body(s.body, deferred)))
            continue
        parts = _match_deferred(s) if isinstance(s, ir.For) else None
        if parts is not None:
            out += _defer(s, *parts)
            deferred.append(s)
        else:
            out.append(s)
    return dataclasses.replace(body, stmts=tuple(out))


def _match_deferred(loop: ir.For) -> Optional[tuple]:
    """(head, first issue, middle 1, P, W, second issue, ring counter or None) of a loop of the
    deferred form (module docstring), else None. The issues are (barrier_wait, gemm, ...,
    gemm_wait 0, barrier_arrive)."""
    counter = schedule.ring_counter(loop)
    b = loop.body.stmts[:-1] if counter is not None else loop.body.stmts
    if (ir.as_int(loop.step) or 0) <= 0:
        return None
    runs = _gemm_runs(b)
    if len(runs) != 2 or runs[0][0] < 1 or runs[1][1] != len(b) - 3:
        return None
    (g1, e1), (g2, e2) = runs
    first, second = b[g1 - 1:e1 + 3], b[g2 - 1:e2 + 3]
    if not all(_issue(x) for x in (first, second)) or e1 + 3 > g2 - 1:
        return None
    head, middle = b[:g1 - 1], b[e1 + 3:g2 - 1]
    if any(isinstance(t, (ir.BarrierWait, ir.BarrierArrive, ir.Gemm, ir.GemmWait))
           for s in head + middle for t in walk(s)):
        return None
    g2_reads, g2_writes = footprint(*second[1:-2])
    h_reads, h_writes = footprint(*head, *first[1:-2])
    if (h_writes & (g2_reads | g2_writes)) or (h_reads & g2_writes):
        return None
    cut = next((k for k, s in enumerate(middle) if touched(s) & (g2_reads | g2_writes)), len(middle))
    if counter is not None and any(counter in touched(s) for s in head + middle):
        return None
    return head, first, middle[:cut], *_operands_first(middle[cut:], g2_reads), second, counter


def _operands_first(middle2, g2_reads: set) -> tuple[tuple, tuple]:
    """(the statements of ``middle2`` writing what the second gemm reads, the rest) where the
    first commute past the rest, else ((), middle2)."""
    p = tuple(s for s in middle2 if footprint(s)[1] & g2_reads)
    w = tuple(s for s in middle2 if not footprint(s)[1] & g2_reads)
    p_reads, p_writes = footprint(*p)
    w_reads, w_writes = footprint(*w)
    if not p or (p_reads & w_writes) or (p_writes & (w_reads | w_writes)):
        return (), tuple(middle2)
    return p, w


def _gemm_runs(stmts) -> list[tuple[int, int]]:
    """(first, last) positions of each run of consecutive gemm statements (one T.gemm, or the
    pieces split_extents made of one)."""
    runs: list[tuple[int, int]] = []
    for k, s in enumerate(stmts):
        if isinstance(s, ir.Gemm):
            runs[-1:] = [(runs[-1][0], k)] if runs and runs[-1][1] == k - 1 else runs[-1:] + [(k, k)]
    return runs


def _issue(stmts) -> bool:
    """barrier_wait R[..]; gemm [wgmma] ...; gemm_wait 0; barrier_arrive E[..] — one ring's use."""
    return (len(stmts) >= 4 and isinstance(stmts[0], ir.BarrierWait)
            and all(isinstance(g, ir.Gemm) and g.instr is ir.GemmInstr.WGMMA for g in stmts[1:-2])
            and isinstance(stmts[-2], ir.GemmWait)
            and stmts[-2].outstanding == 0 and isinstance(stmts[-1], ir.BarrierArrive))


def _defer(loop: ir.For, head, first, middle1, operands, rest, second, counter) -> list:
    """The loop runs over the previous block ``k`` (from start to stop - step), the current one
    being ``k + step``: every index stays a non-negative expression of ``k``. With a ring
    ``counter`` (the body's last statement adds 1 to it), the current block's ring position is
    the counter plus 1, and the peeled last P V adds the last block's 1. The first issue's
    gemms complete when no more than the second issue's are in flight (wgmma groups complete
    in order)."""
    loc = loop.loc
    k, step = loop.var, loop.step
    nxt = ir.BinOp(ir.BinOpKind.ADD, k, step, ir.DType.I32, loc)
    bump = loop.body.stmts[-1:] if counter is not None else ()
    wait_s, gemms_s, arrive_s = first[0], first[1:-2], first[-1]
    wait_p, gemms_p, arrive_p = second[0], second[1:-2], second[-1]
    body = (*operands, *schedule.substitute(head + (wait_s, *gemms_s), k, nxt, counter), wait_p, *gemms_p,
            ir.GemmWait(len(gemms_p), gemms_s[0].loc), *schedule.substitute((arrive_s, *middle1), k, nxt, counter),
            ir.GemmWait(0, gemms_p[0].loc), arrive_p, *schedule.substitute(rest, k, nxt, counter), *bump)
    stop = fold(ir.BinOp(ir.BinOpKind.SUB, loop.stop, step, ir.DType.I32, loc))
    last = fold(schedule.last_index(loop, loc))
    return [*schedule.guarded(loop, schedule.substitute(head + first + middle1 + rest, k, loop.start)),
            dataclasses.replace(loop, stop=stop, body=ir.Seq(body, loop.body.loc)),
            *schedule.guarded(loop, schedule.substitute(operands + second, k, last) + tuple(bump))]
