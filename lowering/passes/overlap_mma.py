"""overlap_mma: keep one warp-group MMA in flight across iterations of a pipelined consumer loop.

Requires:  legalize_wgmma made an ``AsyncPlan`` (otherwise the pass does nothing).
Ensures:   each loop whose body ends ``gemm [wgmma]; gemm_wait 0; barrier_arrive b[i(k)]`` — the
           gemm possibly a run of ``n`` consecutive gemms (split_extents' pieces of one T.gemm),
           each meeting what is said of it below, then waited for with ``gemm_wait`` of the run's length — (or
           that followed by ``c = c + 1`` of a scalar ring counter, and ``i`` a function of c
           instead of k: a loop whose trip count varies by tile), where
           ``i(k)`` is also the ring slot the gemm reads (so the arrival releases that slot), its A
           operand is in shared memory (a register A operand must stay untouched until the gemm
           completes, and the next iteration redefines it) and
           ``b`` holds at least ``MIN_STAGES`` (3) barriers, becomes
           ``gemm; gemm_wait 1; if k > start: barrier_arrive b[i(k - step)]`` (for ``i(k) = x % n``
           spelled ``(x + n - 1) % n``, which stays non-negative) — the stage read by
           the previous iteration's gemm is released once that gemm is known complete, while this
           iteration's gemm runs — followed after the loop by ``gemm_wait 0`` and the release of
           the last iteration's stage. The deferred release costs the producer one stage of lead:
           its fill of iteration k needs the release of k - stages, which the consumer now gives
           at the end of iteration k - stages + 1. With one stage that is after the fill itself
           (deadlock); with two it is the end of iteration k - 1, so every fill starts just as
           its data is wanted and the loads' latency is exposed in every iteration (H100, MLA
           decode's 2-stage ring of 64x576 KV tiles: 1.33x TileLang's time with the wgmma kept in
           flight; see docs/performance.md); with three or more a fill still leads its use by at
           least one iteration. So rings of fewer than three stages are left alone.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir, schedule
from ..plans import AsyncPlan
from ..config import BackendConfig
from ..simplify import fold
from ..traverse import rewrite_loops, transform


MIN_STAGES = 3
"""The fewest ring stages for which keeping a wgmma in flight still leaves the producer a lead."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if kernel.find_plan(AsyncPlan) is None:
        return kernel
    return dataclasses.replace(kernel, body=rewrite_loops(
        kernel.body, lambda loop: _overlap(loop) if _matches(loop) else None))


def _tail_gemms(stmts) -> int:
    """How many gemm statements stand right before the last two of ``stmts`` (one T.gemm, or
    the pieces split_extents made of one)."""
    n = 0
    while n + 2 < len(stmts) and isinstance(stmts[-3 - n], ir.Gemm):
        n += 1
    return n


def _matches(loop: ir.For) -> bool:
    counted = schedule.ring_counter(loop) is not None
    stmts = loop.body.stmts[:-1] if counted else loop.body.stmts
    n = _tail_gemms(stmts)
    if not n:
        return False
    gemms, (wait, arrive) = stmts[-2 - n:-2], stmts[-2:]
    return (all(g.instr is ir.GemmInstr.WGMMA and g.a.buffer.scope is ir.Scope.SHARED for g in gemms)
            and isinstance(wait, ir.GemmWait) and wait.outstanding == 0
            and isinstance(arrive, ir.BarrierArrive)
            and len(arrive.barrier.buffer.arrive_counts) >= MIN_STAGES
            and any(op.starts[:1] == (arrive.barrier.index,) and len(op.extents) == 3
                    for g in gemms for op in (g.a, g.b)))


def _at(e: ir.Expr, node: ir.Expr, value: ir.Expr) -> ir.Expr:
    return fold(transform(e, lambda n: value if n == node else None))


def _overlap(loop: ir.For) -> list[ir.Stmt]:
    """The rewrite. The slot index is a function of the loop index k, or of a counter the body
    increments last (then, after the body, the counter's value minus one is the last slot's)."""
    counter = schedule.ring_counter(loop)
    bump = loop.body.stmts[-1:] if counter is not None else ()
    stmts = loop.body.stmts[:len(loop.body.stmts) - len(bump)]
    issued = _tail_gemms(stmts)
    wait, arrive = stmts[-2:]
    loc = arrive.loc
    i32 = ir.DType.I32
    k, bar = loop.var, arrive.barrier
    n = len(bar.buffer.arrive_counts)
    step = loop.step
    drive: ir.Expr = k
    if counter is not None:
        drive, step = ir.Load(counter, (ir.Const(0, i32, loc),), loc), ir.Const(1, i32, loc)
    if isinstance(bar.index, ir.BinOp) and bar.index.op is ir.BinOpKind.MOD and ir.as_int(bar.index.b) == n:
        # slot (x - 1) % n written as (x + n - 1) % n: never negative, so a plain remainder
        ahead = ir.BinOp(ir.BinOpKind.ADD, drive, ir.BinOp(ir.BinOpKind.MUL, ir.Const(n - 1, i32, loc),
                                                            step, i32, loc), i32, loc)
        prev_index = _at(bar.index, drive, ahead)
    else:
        prev_index = _at(bar.index, drive, ir.BinOp(ir.BinOpKind.SUB, drive, step, i32, loc))
    release_prev = ir.If(ir.Cmp(ir.CmpKind.GT, k, loop.start, loc),
                         ir.Seq((dataclasses.replace(arrive, barrier=dataclasses.replace(
                             bar, index=prev_index)),), loc), ir.Seq((), loc), loc)
    body = stmts[:-2] + (ir.GemmWait(issued, wait.loc), release_prev) + tuple(bump)
    last = prev_index if counter is not None else _at(bar.index, k, schedule.last_index(loop, loc))
    arrive_last = dataclasses.replace(arrive, barrier=dataclasses.replace(bar, index=last))
    ran = fold(ir.Cmp(ir.CmpKind.GT, loop.stop, loop.start, loc))
    release_last = arrive_last if ran == ir.Const(True, ir.DType.BOOL) else \
        ir.If(ran, ir.Seq((arrive_last,), loc), ir.Seq((), loc), loc)
    return [dataclasses.replace(loop, body=ir.Seq(body, loop.body.loc)), ir.GemmWait(0, wait.loc),
            release_last]
