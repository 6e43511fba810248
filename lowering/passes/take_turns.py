"""take_turns: the split roles compute a gemm over all the block's rows in turns, one role per
iteration, instead of each its partial over its own rows.

split_consumers under ``split_partials`` gives each split role its own whole partial of a gemm
summing over the rows (attention backward's ``dQ = dS K``, over the K/V block's keys), staged and
added by its own atomic. Where those partials do not fit the registers beside the roles' other
accumulators (D128: each role's dQ of 64 x 128 beside its dK, dV, S^T and dP^T), split_consumers
marks the split ``ConsumerSplit.turns``, and here the roles take turns: at iteration ``t`` of the
ring (slot ``t % 2``) role ``t % 2`` computes the whole product, over both roles' rows, and adds
it once, while the other goes on to the next iteration. This is cuDNN's schedule for its D128
backward: one warp group's dQ gemm, its wait, store and fence pass under the other's gemms.

Requires:  split_consumers has run and made a ``ConsumerSplit`` of two roles with ``turns``;
           each role's innermost loop holds the run ``copy F_h -> X[rows_h]; gemm X[rows_h]^T
           Y[rows_h] -> C_h (cleared); copy C_h -> S_h; atomic_add G += S_h`` (X, Y shared tiles
           whose dim 0 the roles split, S_h the role's staging tile), and its first statement
           is a wait on a ring of two slots (slot ``s``, parity ``p`` at this iteration).
Ensures:   X gets two slots (``X[s]``); a barrier buffer ``<X>_ready`` of two mbarriers, each
           completed by both roles' arrivals; each role's run becomes

               copy F_h -> X[s, rows_h]; proxy_fence; barrier_arrive ready[s] after_role_barrier;
               if s == h: barrier_wait ready[s] parity=p;
                          gemm X[s]^T Y -> C_h (cleared, all rows); copy C_h -> S_h; atomic_add

           The roles meet only there; a role writes X[s] again two iterations later, after its
           own wait on the other role's arrival one iteration later, which that role gives
           after its gemm of X[s] completed. The epilogue's stores staged through shared memory
           (a fragment copied into a shared tile, then the tile to global memory) store from
           registers instead (the second slot of X and the second role's staging tile take
           their bytes). The roles ask for 240 registers each (``TURN_REGS``). A split without
           that form: unchanged, with a note.
Preserves: program meaning: each iteration's product is added once, over all rows (summation
           order aside); locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, roles
from ..config import BackendConfig
from ..plans import ConsumerSplit
from ..traverse import fresh_name, touched, transform, walk

TURN_REGS = 240
"""Registers per thread of each role taking turns (the producer's 24 leave 488 for the two: the
D128 backward's roles, 64 x 128 dK, dV and dQ each, compile without spills in the loop)."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    split = kernel.find_plan(ConsumerSplit)
    if split is None or not split.turns:
        return kernel
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    by_groups = {r.warpgroups: r for r in ws.roles}
    found = [_turn_run(by_groups[g]) for g in split.roles]
    if len(found) != 2 or any(f is None for f in found) or \
            len({f[1].a.buffer for f in found} | {f[1].b.buffer for f in found}) != 2:
        return kernel.with_note("take_turns: the split roles do not each end a loop with a row "
                                "sum's gemm, staged and added, on a 2-slot ring: each adds its own")
    loc = ws.loc
    x = found[0][1].a.buffer
    slots = 2
    ringed = dataclasses.replace(x, shape=(ir.Const(slots, ir.DType.I32, loc),) + x.shape)
    threads = sum(roles.role_threads(g) for g in split.roles)
    ready = ir.Buffer(fresh_name(kernel, f"{x.name}_ready"), (ir.Const(slots, ir.DType.I32, loc),),
                      ir.DType.I64, ir.Scope.BARRIER, (threads,) * slots, loc)
    new_roles = {}
    unstaged: set = set()
    for h, (g, (write, gemm, copy, add, wait)) in enumerate(zip(split.roles, found)):
        role = by_groups[g]
        slot, parity = wait.barrier.index, wait.parity
        turn = [dataclasses.replace(write, dst=_slotted(write.dst, ringed, slot)),
                ir.ProxyFence(write.loc),       # the other role's wgmma reads these rows
                ir.BarrierArrive(ir.BarrierRef(ready, slot, write.loc), write.loc, after_role_barrier=True),
                ir.If(ir.Cmp(ir.CmpKind.EQ, slot, ir.Const(h, ir.DType.I32, gemm.loc), gemm.loc),
                      ir.Seq((ir.BarrierWait(ir.BarrierRef(ready, slot, gemm.loc), parity, gemm.loc),
                              dataclasses.replace(gemm, a=ir.slot_region(ringed, slot, gemm.a.loc),
                                                  b=ir.whole_region(gemm.b.buffer, gemm.b.loc)),
                              copy, add), gemm.loc),
                      ir.Seq((), gemm.loc), gemm.loc)]
        body, staged = _unstage(_replace_run(role.body, (write, gemm, copy, add), turn))
        unstaged |= staged
        new_roles[g] = dataclasses.replace(role, body=body, num_regs=TURN_REGS)
    ws2 = dataclasses.replace(ws, roles=tuple(new_roles.get(r.warpgroups, r) for r in ws.roles))
    unstaged -= touched(ws2)
    body = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.Alloc) and s.buffer in unstaged:
            continue
        if isinstance(s, ir.Alloc) and s.buffer is x:
            s = ir.Alloc(ringed, s.loc)
        body.append(ws2 if s is ws else s)
    at = max(k for k, s in enumerate(body) if isinstance(s, ir.Alloc)) + 1
    body[at:at] = [ir.Alloc(ready, loc)]
    names = [roles.describe(g) for g in split.roles]
    return dataclasses.replace(kernel, body=ir.Seq(tuple(body), kernel.body.loc)).with_note(
        f"take_turns: {names[0]} and {names[1]} compute {found[0][1].c.buffer.name.rsplit('_', 1)[0]} "
        f"over all {ir.as_int(x.shape[0])} rows in turns, one per iteration ({x.name} in {slots} "
        f"slots, {ready.name}); the epilogue stores from registers")


def _turn_run(role: ir.Role) -> Optional[tuple]:
    """(copy F -> X rows, gemm, copy C -> S, atomic_add, the loop's first wait) of the role's
    innermost loop, or None."""
    for lp in walk(role.body):
        if not isinstance(lp, ir.For) or any(isinstance(t, ir.For) for t in walk(lp.body)):
            continue
        stmts = lp.body.stmts
        if not stmts or not isinstance(stmts[0], ir.BarrierWait) \
                or ir.as_int(stmts[0].barrier.buffer.shape[0]) != 2:
            return None
        for k in range(len(stmts) - 3):
            write, gemm, copy, add = stmts[k:k + 4]
            if (isinstance(write, ir.Copy) and isinstance(gemm, ir.Gemm) and isinstance(copy, ir.Copy)
                    and isinstance(add, ir.AtomicAdd) and gemm.transpose_a and gemm.clear_accum
                    and write.src.buffer.scope is ir.Scope.FRAGMENT and write.dst.buffer is gemm.a.buffer
                    and write.dst.buffer.scope is ir.Scope.SHARED and gemm.b.buffer.scope is ir.Scope.SHARED
                    and copy.src.buffer is gemm.c.buffer and copy.src.is_whole and copy.dst.is_whole
                    and isinstance(add.value, ir.Region) and add.value.buffer is copy.dst.buffer
                    and len(gemm.a.buffer.shape) == 2):
                return write, gemm, copy, add, stmts[0]
    return None


def _slotted(r: ir.Region, ringed: ir.Buffer, slot: ir.Expr) -> ir.Region:
    """``r`` (of the one-slot buffer) in slot ``slot`` of ``ringed``."""
    return ir.Region(ringed, (slot,) + r.starts, (1,) + r.extents, r.loc)


def _replace_run(body: ir.Seq, run_: tuple, new: list) -> ir.Seq:
    def fn(n):
        if not isinstance(n, ir.Seq) or run_[0] not in n.stmts:
            return None
        k = n.stmts.index(run_[0])
        if n.stmts[k:k + len(run_)] != run_:
            return None
        return dataclasses.replace(n, stmts=n.stmts[:k] + tuple(new) + n.stmts[k + len(run_):])
    return transform(body, fn)


def _unstage(body: ir.Seq) -> tuple[ir.Seq, set]:
    """``body`` with each staged store (``copy F -> S; proxy_fence; copy S -> G`` in one
    statement list, F a fragment, G global) made one store from registers (``copy F -> G``),
    and the staging tiles those stores used."""
    staged: set = set()

    def fn(n):
        if not isinstance(n, ir.Seq):
            return None
        stmts, out, k = n.stmts, [], 0
        while k < len(stmts):
            s, fence, store = stmts[k], *(stmts[k + 1:k + 3] + (None, None))[:2]
            if isinstance(s, ir.Copy) and isinstance(fence, ir.ProxyFence) and isinstance(store, ir.Copy) \
                    and s.src.buffer.scope is ir.Scope.FRAGMENT and s.dst.buffer.scope is ir.Scope.SHARED \
                    and store.src.buffer is s.dst.buffer and store.src.starts == s.dst.starts \
                    and store.src.extents == s.dst.extents and store.dst.buffer.scope is ir.Scope.GLOBAL:
                out.append(dataclasses.replace(store, src=s.src))
                staged.add(s.dst.buffer)
                k += 3
                continue
            out.append(s)
            k += 1
        return dataclasses.replace(n, stmts=tuple(out)) if len(out) != len(stmts) else None
    return transform(body, fn), staged

