"""overlap_softmax: issue the next iteration's first gemm before this iteration's fragment math
(FlashAttention-3's intra-warp-group overlap: Q K^T of block k + 1 runs on the tensor cores while
the softmax of block k runs on the ALUs).

Requires:  legalize_wgmma made an ``AsyncPlan``. Loops whose tail holds a gemm (attention) are
           rewritten only when ``target.overlap_softmax`` (the ``TILEWS_OVERLAP_SOFTMAX`` switch)
           is on: it is off by default, on an H100 it measured 0-10% slower than waiting for
           Q K^T before the softmax (attention D 64/128, docs/measuring.md), the P V gemm still
           being waited in its own iteration. Loops whose tail holds none (an FP8 promotion:
           the partial product scaled into the accumulator) are rewritten when
           ``target.overlap_promotion`` is on; off by default, as on an H100 it measured 10-20%
           slower for block-scaled FP8 GEMMs than waiting for each k-block's product
           (scripts/tune_fp8.py, not persistent, split consumers).
Ensures:   a role loop ``for k in serial(start, stop, step)`` (step a positive constant) whose
           body is

               barrier_wait R[i(k)] p(k); H(k); gemm A, B -> X [wgmma]; gemm_wait 0; T(k);
               barrier_arrive E[i(k)]

           where ``R`` holds >= 2 barriers (so waiting for block k + 1 never needs block k's
           release), ``H`` (the head: e.g. the causal mask into X) writes only X, the gemm's A is
           in shared memory, ``T`` (the tail) holds another gemm followed by a ``gemm_wait 0``
           (or no gemm: then ``gemm_wait 0`` is added after the arrival, below),
           nothing in ``T`` writes what the head or the first gemm read other than X, and X is
           touched nowhere else in the role, becomes (the last iteration peeled, so every
           issued gemm is waited for in the iteration that issued it: Gluon carries only
           completed accumulators through loops and branches)

               [if start < stop:] barrier_wait R[i(start)] p(start); H(start); gemm -> X; gemm_wait 0
               for k in serial(start, stop - step, step):
                   copy X -> X_cur
                   barrier_wait R[i(k + step)] p(k + step); H(k + step); gemm -> X
                   T(k) with X read and written as X_cur; barrier_arrive E[i(k)]
               [if start < stop:] copy X -> X_cur; T(last); barrier_arrive E[i(last)]

           X_cur is a new fragment with X's layout (added to the ``LayoutPlan``). The tail's own
           ``gemm_wait 0`` completes the next block's gemm too (wgmma groups complete in order);
           a tail without a gemm is followed by ``gemm_wait 0`` in the loop body.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, schedule
from ..plans import AsyncPlan, LayoutPlan
from ..simplify import fold
from ..target import Target
from ..traverse import buffers_read, buffers_written, transform, walk


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    if not (target.overlap_softmax or target.overlap_promotion) or kernel.find_plan(AsyncPlan) is None:
        return kernel
    layouts = dict(kernel.plan(LayoutPlan).layouts)
    allocs: list[ir.Alloc] = []
    stmts = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.WarpSpecialize):
            s = dataclasses.replace(s, roles=tuple(_role(r, layouts, allocs, target) for r in s.roles))
        stmts.append(s)
    if not allocs:
        return kernel
    body = ir.Seq(tuple(allocs) + tuple(stmts), kernel.body.loc)
    plan = kernel.plan(LayoutPlan)
    out = dataclasses.replace(kernel, body=body).with_plan(
        LayoutPlan(tuple(sorted(layouts.items())), plan.frames))
    names = ", ".join(a.buffer.name.removesuffix("_cur") for a in allocs)
    return out.with_note(f"overlap_softmax: the next block's gemm into {names} is issued before "
                         f"this block's fragment math, which reads a copy")


def _role(role: ir.Role, layouts: dict, allocs: list, target: Target) -> ir.Role:
    out = []
    for k, s in enumerate(role.body.stmts):
        rest = role.body.stmts[:k] + role.body.stmts[k + 1:]
        split = _match(s, rest) if isinstance(s, ir.For) else None
        if split is not None and not (target.overlap_softmax if _tail_gemm(split[2])
                                      else target.overlap_promotion):
            split = None
        if split is None:
            out.append(s)
            continue
        out += _overlap(s, *split, layouts, allocs)
    return dataclasses.replace(role, body=ir.Seq(tuple(out), role.body.loc))


def _match(loop: ir.For, others) -> Optional[tuple]:
    """(head, first gemm, tail) of a loop of the form in the module docstring, else None."""
    b = loop.body.stmts
    if (ir.as_int(loop.step) or 0) <= 0 or len(b) < 5:
        return None
    wait, arrive = b[0], b[-1]
    if not (isinstance(wait, ir.BarrierWait) and isinstance(arrive, ir.BarrierArrive)
            and len(wait.barrier.buffer.arrive_counts) >= 2):
        return None
    g = next((k for k, s in enumerate(b) if isinstance(s, ir.Gemm)), None)
    if g is None or g + 1 >= len(b) - 1:
        return None
    gemm, gwait = b[g], b[g + 1]
    if not (gemm.instr is ir.GemmInstr.WGMMA and gemm.a.buffer.scope is ir.Scope.SHARED
            and isinstance(gwait, ir.GemmWait) and gwait.outstanding == 0):
        return None
    x = gemm.c.buffer
    head, tail = b[1:g], b[g + 2:-1]
    if not tail:
        return None
    head_writes = {w for s in head for t in walk(s) for w in buffers_written(t)}
    if head_writes - {x} or any(isinstance(t, (ir.BarrierWait, ir.BarrierArrive, ir.Gemm, ir.GemmWait))
                                for s in head for t in walk(s)):
        return None
    needs = {r for s in head + (gemm,) for t in walk(s) for r in buffers_read(t)} - {x}
    tail_writes = {w for s in tail for t in walk(s) for w in buffers_written(t)}
    if needs & tail_writes:
        return None
    if any(x in buffers_read(t) + buffers_written(t) for s in others for t in walk(s)):
        return None
    return head, gemm, tail


def _tail_gemm(tail) -> bool:
    return any(isinstance(t, ir.Gemm) for s in tail for t in walk(s))


def _overlap(loop: ir.For, head, gemm: ir.Gemm, tail, layouts: dict, allocs: list) -> list:
    loc = loop.loc
    k, step = loop.var, loop.step
    x = gemm.c.buffer
    cur = dataclasses.replace(x, name=f"{x.name}_cur")
    allocs.append(ir.Alloc(cur, x.loc))
    layouts[cur.name] = layouts[x.name]
    wait, arrive = loop.body.stmts[0], loop.body.stmts[-1]

    def at(stmts, value: ir.Expr) -> tuple:
        return tuple(transform(s, lambda n: fold(n) if isinstance(n, ir.Expr) else None)
                     for s in (transform(t, lambda n: value if n == k else None) for t in stmts))

    def region(b):
        return ir.Region(b, tuple(ir.Const(0, ir.DType.I32, loc) for _ in b.shape), b.static_shape, loc)

    def guarded(stmts) -> list:
        ran = fold(ir.Cmp(ir.CmpKind.LT, loop.start, loop.stop, loc))
        if ran == ir.Const(True, ir.DType.BOOL):
            return list(stmts)
        return [ir.If(ran, ir.Seq(tuple(stmts), loc), ir.Seq((), loc), loc)]

    take = ir.Copy(region(x), region(cur), mechanism=ir.CopyMechanism.DIRECT, loc=gemm.loc)
    issue = (wait, *head, gemm)
    finish = (*(transform(s, lambda n: cur if n == x else None) for s in tail), arrive)
    nxt = ir.BinOp(ir.BinOpKind.ADD, k, step, ir.DType.I32, loc)
    complete = () if _tail_gemm(tail) else (ir.GemmWait(0, gemm.loc),)
    body = (take, *at(issue, nxt), *finish, *complete)
    last = fold(schedule.last_index(loop, loc))
    return [*guarded(at(issue, loop.start) + (ir.GemmWait(0, gemm.loc),)),
            dataclasses.replace(loop, stop=fold(ir.BinOp(ir.BinOpKind.SUB, loop.stop, step, ir.DType.I32, loc)),
                                body=ir.Seq(body, loop.body.loc)),
            *guarded((take,) + at(finish, last))]
