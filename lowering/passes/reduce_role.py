"""reduce_role: a warp of its own issues the bulk reduce-adds a consumer's loop makes from a staged
tile (the attention backward's dQ), so the consumer's warp groups only store the tile, fence and
arrive, and run on to the next iteration's gemms while the add goes out.

Requires:  the schedule is final (after merge_releases: the ring releases are placed and merged);
           legalize_wgmma made an ``AsyncPlan``; ``config.policy.reduce_role`` is on
           (``TILEWS_REDUCE_ROLE``; otherwise the pass does nothing).
Ensures:   where a warp specialization has one consumer role beside a one-warp producer, and the
           consumer's innermost loop holding gemms ends (before its ring counter's increment,
           if it keeps one) with

               barrier_arrive R[n % S]            the loop's only arrival: its ring slot's release
               bulk_store_wait 0                  overlap_store's, before X's next write
               copy F -> X [direct]               X: a shared tile nothing else of the role touches
               proxy_fence
               atomic_add G[...] += X             a bulk reduce-add whose coordinates and whose
                                                  loops' bounds read no buffer of the role

           (n the loop's running count, S the ring's stages), that run becomes

               barrier_wait <X>_drained[0] parity=(n & 1) ^ 1
               copy F -> X [direct]
               proxy_fence
               barrier_arrive R[n % S] after_role_barrier    the release now also hands X over

           and a reducer role of one warp, in a warp group after the last (the kernel's
           ``threads`` count it), runs the consumer's loops (their bounds, and its own copy of
           their ring counter) with, per iteration,

               barrier_wait R[n % S] parity=(n // S) & 1    the consumer's release of iteration n
               atomic_add G[...] += X
               bulk_store_wait 0                            the add has read X
               barrier_arrive <X>_drained[0]

           and ``bulk_store_wait 0`` before it ends. ``<X>_drained`` (one mbarrier, one arrival
           of the reducer a phase) and the reducer's counter are allocated beside the kernel's
           other buffers and entered in the ``AsyncPlan`` (with the reducer among the readers of
           the pointers its loops read: the causal backward's order table). Anything else:
           unchanged.
Preserves: program meaning. The add of iteration n reads X after the consumer's release of n,
           which follows X's store, its proxy fence and the role's barrier; the consumer writes
           X again only after the reducer's arrival for n, which follows the add's reads. No wait
           misses a phase: R[n % S] completes its next phase only with the release of iteration
           n + S, after the consumer's wait for the reducer's arrival of iteration n + S - 1 >= n,
           so the reducer's wait of iteration n has passed by then; the producer's waits on R
           see the same phases, later. Locations.

The D128 attention backward's main kernel (one merged consumer): per query block its two warp
groups no longer meet at a barrier to issue the add, nor wait for the previous add to have read
the tile; the release they already gave carries the hand-over (an arrival of its own would cost
another barrier: Triton puts one between two mbarrier operations), so the loop has 3 block
barriers instead of 4. Measured in docs/performance.md ("Attention backward").
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, roles, schedule
from ..config import BackendConfig
from ..plans import AsyncPlan
from ..traverse import bulk_reduce, exprs_of, fresh_name, rewrite, subexprs, transform, users, walk

REDUCER_WARPS = 1
"""Warps of the reducer role: one thread issues each add."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    plan = kernel.find_plan(AsyncPlan)
    if plan is None or not config.policy.reduce_role:
        return kernel
    ws = next((s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)), None)
    if ws is None or len(ws.roles) != 2:
        return kernel
    producer, consumer = sorted(ws.roles, key=lambda r: r.num_warps)
    found = _staged_add(consumer) if producer.num_warps == 1 else None
    if found is None:
        return kernel
    loop, counter, run_ = found
    release, copy = run_[0], run_[2]
    x = copy.dst.buffer
    drained = ir.Buffer(fresh_name(kernel, f"{x.name}_drained"), (ir.Const(1, ir.DType.I32, copy.loc),),
                        ir.DType.I64, ir.Scope.BARRIER, (roles.role_threads((0,)),), copy.loc)
    own = None if counter is None else dataclasses.replace(
        counter, name=fresh_name(kernel, "reduced", frozenset({drained.name})))
    group = max(g for r in ws.roles for g in r.warpgroups) + 1
    reducer = _reducer(consumer, loop, run_, drained, counter, own, group, producer.num_regs)
    staged = _consumer_staging(consumer, loop, counter, run_, drained)
    ws2 = dataclasses.replace(ws, roles=tuple(staged if r is consumer else r for r in ws.roles) + (reducer,))
    body = [ws2 if s is ws else s for s in kernel.body.stmts]
    at = max(k for k, s in enumerate(body) if isinstance(s, ir.Alloc)) + 1
    body[at:at] = [ir.Alloc(drained, copy.loc)] + ([ir.Alloc(own, copy.loc)] if own is not None else [])
    return dataclasses.replace(kernel, body=ir.Seq(tuple(body), kernel.body.loc),
                               threads=kernel.threads + 128).with_plan(
        _plan_with(plan, reducer, drained, counter, own)).with_note(
        f"reduce_role: the bulk reduce-adds of {x.name} in {roles.describe(consumer.warpgroups)}'s "
        f"loop at line {loop.loc.line} go out from a reducer warp, {roles.describe((group,))}; the "
        f"release of {release.barrier.buffer.name} follows {x.name}'s store and hands it over, "
        f"{drained.name} hands it back")


def _running(release: ir.BarrierArrive) -> Optional[tuple[ir.Expr, int]]:
    """(running count n, stages S) of a ring release at slot ``n % S``; else None."""
    slot = release.barrier.index
    if isinstance(slot, ir.BinOp) and slot.op is ir.BinOpKind.MOD and ir.as_int(slot.b) is not None:
        return slot.a, ir.as_int(slot.b)
    return None


def _consumer_staging(consumer: ir.Role, loop: ir.For, counter: Optional[ir.Buffer], run_: tuple,
                      drained: ir.Buffer) -> ir.Role:
    """The consumer with its loop's run replaced: wait for the hand-back, store, fence, release
    (after the role's barrier: it hands the tile over)."""
    release, _, copy, fence, _ = run_
    running, _ = _running(release)
    i32, loc = ir.DType.I32, copy.loc
    this_use = ir.BinOp(ir.BinOpKind.AND, running, ir.Const(1, i32, loc), i32, loc)
    staged = (ir.BarrierWait(ir.BarrierRef(drained, ir.Const(0, i32, loc), loc),
                             schedule.flipped(this_use, loc), loc),
              copy, fence, dataclasses.replace(release, after_role_barrier=True))

    def replace_run(s: ir.Stmt):
        if not (isinstance(s, ir.For) and s == loop):
            return None
        stmts = s.body.stmts
        bump = stmts[-1:] if counter is not None else ()
        return dataclasses.replace(s, body=dataclasses.replace(
            s.body, stmts=stmts[:len(stmts) - len(bump) - len(run_)] + staged + bump))
    return rewrite(consumer, replace_run)


def _reducer(consumer: ir.Role, loop: ir.For, run_: tuple, drained: ir.Buffer,
             counter: Optional[ir.Buffer], own: Optional[ir.Buffer], group: int, regs: int) -> ir.Role:
    """The reducer role: the consumer's loops around ``loop`` (their ring counter in ``own``),
    each iteration waiting for the release, adding, waiting for the add's reads and handing the
    tile back; a bulk wait before it ends."""
    release, _, _, _, add = run_
    running, stages = _running(release)
    loc = add.loc
    _, parity = schedule.ring_slot(running, stages, loc)
    per_iteration = [ir.BarrierWait(release.barrier, parity, loc), add, ir.BulkStoreWait(0, loc),
                     ir.BarrierArrive(ir.BarrierRef(drained, ir.Const(0, ir.DType.I32, loc), loc), loc)]
    body = tuple(_projected(consumer.body, loop, per_iteration, counter))
    if own is not None:
        body = transform(body, lambda n: own if n == counter else None)
    return ir.Role((group,), ir.Seq(body + (ir.BulkStoreWait(0, loc),), loc),
                   num_warps=REDUCER_WARPS, num_regs=regs, loc=loc)


def _plan_with(plan: AsyncPlan, reducer: ir.Role, drained: ir.Buffer, counter: Optional[ir.Buffer],
               own: Optional[ir.Buffer]) -> AsyncPlan:
    """``plan`` with the hand-back barrier (one arrival a phase), the reducer's counter (as the
    consumer's is) and the reducer among the readers of the pointers its loops read."""
    read = {x.buffer.name for t in walk(reducer) for e in exprs_of(t) for x in subexprs(e)
            if isinstance(x, ir.Load)}
    counters = ((own.name, dict(plan.scalar_locals)[counter.name]),) if own is not None else ()
    return dataclasses.replace(
        plan, barrier_counts=plan.barrier_counts + ((drained.name, (1,)),),
        pointer_params=tuple((name, readers + (reducer.warpgroups,) if name in read else readers)
                             for name, readers in plan.pointer_params),
        scalar_locals=plan.scalar_locals + counters)


def _staged_add(role: ir.Role) -> Optional[tuple[ir.For, Optional[ir.Buffer], tuple]]:
    """The consumer's innermost loop holding gemms, its ring counter (or None) and its run
    (release at a ring slot ``n % S``, bulk wait, staging copy, fence, bulk reduce-add), where it
    has the form of the module docstring; else None."""
    loops = [s for s in walk(role.body) if isinstance(s, ir.For)
             and any(isinstance(t, ir.Gemm) for t in s.body.stmts)]
    if len(loops) != 1:
        return None
    loop = loops[0]
    stmts = list(loop.body.stmts)
    counter = schedule.ring_counter(loop)
    if counter is not None:
        stmts = stmts[:-1]
    if len(stmts) < 5:
        return None
    release, wait, copy, fence, add = stmts[-5:]
    if not (isinstance(release, ir.BarrierArrive) and isinstance(wait, ir.BulkStoreWait) and wait.outstanding == 0
            and isinstance(copy, ir.Copy) and copy.mechanism is ir.CopyMechanism.DIRECT
            and copy.src.buffer.scope is ir.Scope.FRAGMENT and copy.dst.buffer.scope is ir.Scope.SHARED
            and isinstance(fence, ir.ProxyFence) and bulk_reduce(add) and add.value.buffer == copy.dst.buffer):
        return None
    if sum(isinstance(s, ir.BarrierArrive) for s in walk(loop)) != 1 or _running(release) is None:
        return None
    if users(role.body, copy.dst.buffer) != [copy, add]:
        return None
    around = [s for s in walk(role.body) if isinstance(s, (ir.For, ir.If)) and _holds(s, loop)]
    if any(_reads_role_buffers(s, counter) for s in [add] + around):
        return None
    return loop, counter, (release, wait, copy, fence, add)


def _reads_role_buffers(s: ir.Stmt, counter: Optional[ir.Buffer]) -> bool:
    """Whether ``s``'s own expressions (its coordinates, a loop's bounds, a branch's condition)
    read a buffer that is not global memory (a role's registers, locals or shared tiles) other
    than the ring counter."""
    loads = {x.buffer for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)}
    return any(b.scope is not ir.Scope.GLOBAL and b != counter for b in loads)


def _holds(s: ir.Stmt, target: ir.Stmt) -> bool:
    return any(t is target for t in walk(s))


def _projected(seq: ir.Seq, loop: ir.For, per_iteration: list, counter: Optional[ir.Buffer]) -> list:
    """The statements of ``seq`` that lead to ``loop`` (the loops and branches around it, the ring
    counter's stores), with ``loop``'s body replaced by ``per_iteration`` (and the counter's
    increment)."""
    out = []
    for s in seq.stmts:
        if s is loop:
            bump = list(s.body.stmts[-1:]) if counter is not None else []
            out.append(dataclasses.replace(s, body=ir.Seq(tuple(per_iteration + bump), s.body.loc)))
        elif isinstance(s, ir.For) and _holds(s, loop):
            out.append(dataclasses.replace(s, body=ir.Seq(tuple(_projected(s.body, loop, per_iteration, counter)),
                                                          s.body.loc)))
        elif isinstance(s, ir.If) and _holds(s, loop):
            out.append(dataclasses.replace(
                s, then=ir.Seq(tuple(_projected(s.then, loop, per_iteration, counter)), s.then.loc),
                orelse=ir.Seq(tuple(_projected(s.orelse, loop, per_iteration, counter)), s.orelse.loc)))
        elif isinstance(s, ir.Store) and counter is not None and s.buffer == counter:
            out.append(s)
    return out
