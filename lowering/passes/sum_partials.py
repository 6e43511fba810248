"""sum_partials: the split roles' partial products summed in shared memory and added once, not
once per role.

split_consumers under ``split_partials`` gives each split role its own partial of a gemm summing
over the rows (attention backward's dQ), staged in its own shared tile and added into global memory
by its own block-level atomic: n roles add n tiles where the one role added one (D64 attention
backward: twice dQ's reduce-add traffic). Here the roles after the first hand their partials to
the first, which adds them to its own and adds the sum once.

Requires:  split_consumers has run; applies under ``config.policy.sum_partials`` to kernels with
           a ``ConsumerSplit`` whose roles each end, in the same innermost loop, a run
           ``copy C_h -> S_h; atomic_add G += S_h`` (C_h a fragment copied whole into the shared
           tile S_h, which nothing else in the loop or the role touches), the loop's first
           statement a wait on a ring slot ``F[s]`` with parity ``p`` (warp_specialize's ring:
           slot ``s`` of ``S`` slots, ``p`` its phase at this iteration).
Ensures:   each S_h (h >= 1) gets ``S`` slots and two barrier buffers of ``S`` mbarriers, ``full``
           (role h's arrival completes one) and ``free`` (role 0's); role h's run becomes

               barrier_wait free_h[s] parity=p ^ 1; copy C_h -> S_h[s];
               barrier_arrive full_h[s] after_role_barrier

           and role 0's, for each h in order, ``barrier_wait full_h[s] parity=p; copy S_h[s] ->
           R; barrier_arrive free_h[s] after_role_barrier; C_0 += R`` (R a fragment of C_0's
           shape, ``recv``), then its own copy and atomic as before. Role h writes slot s again
           only after role 0 has read it (its wait on ``free_h[s]`` one phase later), and role 0
           reads it only after role h wrote it. Split roles without that form: unchanged, with a
           note; a kernel without a ``ConsumerSplit``: unchanged.
Preserves: program meaning: the atomic adds sum_h C_h where it added each C_h (floating-point
           order aside); locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, roles, schedule
from ..config import BackendConfig
from ..plans import ConsumerSplit
from ..traverse import fresh_name, transform, users, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    split = kernel.find_plan(ConsumerSplit)
    if not config.policy.sum_partials or split is None:
        return kernel
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    by_groups = {r.warpgroups: r for r in ws.roles}
    found = [_staged_add(by_groups[g]) for g in split.roles]
    if any(f is None for f in found):
        return kernel.with_note("sum_partials: the split roles do not each end a loop with a staged "
                                "partial's atomic add: each adds its own")
    ring = found[0][2]
    slots = ir.as_int(ring.barrier.buffer.shape[0])
    loc = ws.loc
    threads = roles.role_threads(split.roles[0])
    staged, bars, allocs = {}, {}, []
    for h, (_, stage, _) in enumerate(found[1:], start=1):
        s_h = stage.value.buffer
        ringed = dataclasses.replace(s_h, shape=(_const(slots, loc),) + s_h.shape)
        full, free = (ir.Buffer(fresh_name(kernel, f"{s_h.name}_{what}"), (_const(slots, loc),),
                                ir.DType.I64, ir.Scope.BARRIER, (threads,) * slots, loc)
                      for what in ("full", "free"))
        staged[s_h], bars[h] = ringed, (full, free)
        allocs += [full, free]
    recv = dataclasses.replace(found[0][0].src.buffer, name=fresh_name(kernel, "recv"))
    allocs.append(recv)
    new_roles = {}
    for h, (g, (copy, add, wait)) in enumerate(zip(split.roles, found)):
        slot, parity = wait.barrier.index, wait.parity
        if h == 0:
            run_ = _receive(copy, slot, parity, [(staged[f[1].value.buffer], bars[k])
                                                 for k, f in enumerate(found[1:], start=1)], recv)
        else:
            run_ = _send(copy, staged[add.value.buffer], bars[h], slot, parity)
        new_roles[g] = dataclasses.replace(by_groups[g], body=_replace_run(by_groups[g].body, copy, add, run_))
    ws2 = dataclasses.replace(ws, roles=tuple(new_roles.get(r.warpgroups, r) for r in ws.roles))
    body = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.Alloc) and s.buffer in staged:
            s = ir.Alloc(staged[s.buffer], s.loc)
        body.append(ws2 if s is ws else s)
    at = max(k for k, s in enumerate(body) if isinstance(s, ir.Alloc)) + 1
    body[at:at] = [ir.Alloc(b, loc) for b in allocs]
    names = ", ".join(roles.describe(g) for g in split.roles[1:])
    return dataclasses.replace(kernel, body=ir.Seq(tuple(body), kernel.body.loc)).with_note(
        f"sum_partials: {names} hand their partials "
        f"({', '.join(f[0].src.buffer.name for f in found[1:])}) to {roles.describe(split.roles[0])} "
        f"through shared memory ({', '.join(b.name for b in staged.values())}, {slots} slots), "
        f"which adds the sum ({found[0][0].src.buffer.name}) once")


def _const(v: int, loc: ir.Loc) -> ir.Const:
    return ir.Const(v, ir.DType.I32, loc)


def _staged_add(role: ir.Role) -> Optional[tuple[ir.Copy, ir.AtomicAdd, ir.BarrierWait]]:
    """(copy C -> S, atomic G += S, the loop's first wait) of the role's innermost loop holding
    such a run, or None."""
    for lp in walk(role.body):
        if not isinstance(lp, ir.For) or any(isinstance(t, ir.For) for t in walk(lp.body)):
            continue
        stmts = lp.body.stmts
        for k in range(len(stmts) - 1):
            copy, add = stmts[k], stmts[k + 1]
            if not (isinstance(copy, ir.Copy) and isinstance(add, ir.AtomicAdd)
                    and isinstance(add.value, ir.Region) and add.value.buffer is copy.dst.buffer
                    and copy.src.buffer.scope is ir.Scope.FRAGMENT and copy.src.is_whole
                    and copy.dst.is_whole and add.value.is_whole
                    and copy.dst.buffer.scope is ir.Scope.SHARED):
                continue
            if users(role.body, copy.dst.buffer) != [copy, add] or not isinstance(stmts[0], ir.BarrierWait):
                return None
            return copy, add, stmts[0]
    return None


def _send(copy: ir.Copy, ringed: ir.Buffer, bars, slot, parity) -> list:
    full, free = bars
    loc = copy.loc
    return [ir.BarrierWait(ir.BarrierRef(free, slot, loc), schedule.flipped(parity, loc), loc),
            dataclasses.replace(copy, dst=ir.slot_region(ringed, slot, loc)),
            ir.BarrierArrive(ir.BarrierRef(full, slot, loc), loc, after_role_barrier=True)]


def _receive(copy: ir.Copy, slot, parity, senders, recv: ir.Buffer) -> list:
    loc = copy.loc
    acc = copy.src.buffer
    out = []
    for ringed, (full, free) in senders:
        out += [ir.BarrierWait(ir.BarrierRef(full, slot, loc), parity, loc),
                ir.Copy(ir.slot_region(ringed, slot, loc), ir.whole_region(recv, loc), loc=loc),
                ir.BarrierArrive(ir.BarrierRef(free, slot, loc), loc, after_role_barrier=True),
                _accumulate(acc, recv, loc)]
    return out + [copy]


def _accumulate(acc: ir.Buffer, part: ir.Buffer, loc: ir.Loc) -> ir.Parallel:
    """``acc[i, j] += part[i, j]`` over the whole tile."""
    i, j = (ir.Var(n, ir.DType.I32, ir.VarKind.PARALLEL, loc) for n in ("i_sum", "j_sum"))
    value = ir.BinOp(ir.BinOpKind.ADD, ir.Load(acc, (i, j), loc), ir.Load(part, (i, j), loc),
                     acc.dtype, loc)
    return ir.Parallel((i, j), acc.static_shape, ir.Seq((ir.Store(acc, (i, j), value, loc),), loc), loc)


def _replace_run(body: ir.Seq, copy: ir.Copy, add: ir.AtomicAdd, run_: list) -> ir.Seq:
    """``body`` with the run ``copy; add`` replaced by ``run_`` (``add`` kept after a
    receiver's run, which ends with ``copy``)."""
    keep_add = run_[-1] is copy

    def fn(n):
        if not isinstance(n, ir.Seq) or copy not in n.stmts:
            return None
        k = n.stmts.index(copy)
        tail = (add,) if keep_add else ()
        return dataclasses.replace(n, stmts=n.stmts[:k] + tuple(run_) + tail + n.stmts[k + 2:])
    return transform(body, fn)
