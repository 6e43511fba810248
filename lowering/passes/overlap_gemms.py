"""overlap_gemms: issue a block's independent wgmmas together and wait for each only where its
result (or an operand it still reads) is first needed, so the warp group's fragment math runs
while the tensor cores work — the intra-warp-group overlap FlashAttention-3's backward writes by
hand, made by the compiler for any statement list of that form.

Requires:  legalize_wgmma made an ``AsyncPlan`` and ``config.policy.overlap_gemms`` is on
           (``TILEWS_OVERLAP_GEMMS``; otherwise the pass does nothing); overlap_softmax,
           pingpong and overlap_mma have run (a list they rewrote has waits that leave gemms in
           flight, and is left alone).
Ensures:   every statement list (a role's body, a loop body, a branch) whose waits are all
           legalize_wgmma's ``gemm [wgmma]; gemm_wait 0`` (a run of gemms then one wait) and
           which holds at least two wgmmas is rescheduled:

           1. each wgmma moves up past the statements before it that neither write its operands
              or accumulator nor read its accumulator; the first ``barrier_wait`` it meets (the
              wait for its ring slot) joins it and moves on with it, so the statements between
              them stay after both; it stops at another gemm, a wait, a barrier operation, a proxy fence,
              a bulk copy or a statement holding any of those (gemms keep their order; waits
              move earlier only past statements that involve no barrier, so no role waits on an
              arrival it used to give first). The list's first wgmma also carries the loads of
              shared memory into fragments that it meets before its wait (written between the
              wait and the gemm: read from the slot the wait guards), so they stay ahead of it:
              issued after the gemms, their shared reads queue behind the gemms' operand reads,
              and the first gemm's wait is where values are first needed (the attention
              backward's LSE, read by the exponentials right after ``S^T``'s wait: 8.5% of the
              D128 consumer's stall samples, on an H100 the main kernel 4% faster with the load
              ahead). Later gemms' loads are not carried: their values are first needed after
              later waits, and ahead of their gemms they would live in registers across the
              fragment math in between (Delta, carried with ``dP^T``, took that 4% back);
           2. the waits are placed lazily: before a statement that touches an in-flight gemm's
              accumulator, writes its operands (shared or register), or holds a gemm, wait or
              barrier wait in a nested body, ``gemm_wait n`` completes the newest gemm it needs
              (``n``: the gemms issued after that one, which stay in flight; wgmma groups
              complete in order);
           3. an arrival that releases a ring slot an in-flight gemm reads (the check of
              verify_async) is held back until a wait placed for another reason completes that
              gemm, or until the next barrier wait, a statement writing what the arrival reads
              (a ring slot counter: the interpreter found the deadlock moving it past one made)
              or the end of the list; arrivals keep their order among themselves, except a
              hand-over (an arrival after the role's barrier) that no in-flight gemm holds back:
              it goes out where it is written, before held arrivals on other barriers
              (take_turns' dS: held behind the ring's releases until the role's gemms completed,
              it delayed the other role, and ptxas 12.8 crashed on the kernel);
           4. the list ends with ``gemm_wait 0`` (Gluon carries only completed accumulators
              across iterations and out of branches) followed by the held-back arrivals;
           5. a ``bulk_store_wait`` (overlap_store's, before its staging buffer's next write)
              stays just before the statement that followed it, after the gemm waits and
              arrivals steps 2-3 place there (Triton follows the bulk store wait with a barrier
              of the role's threads; placed before the arrivals, each arrival after it needed
              one more: the attention backward's sm_90a loop, 6 ``BAR.SYNC`` instead of 5).

           On the attention backward's loop body this issues ``S^T = K Q^T`` and
           ``dP^T = V dO^T`` back to back, runs the exponentials under ``dP^T``, ``dS^T`` under
           the ``dV`` gemm and dS's store to shared memory under the ``dK`` gemm.
Preserves: program meaning (the interpreter runs gemms synchronously; statements move only past
           statements they share no buffer with, and waits only order asynchronous work: a bulk
           store wait still precedes the statement it preceded) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir, roles
from ..config import BackendConfig
from ..plans import AsyncPlan
from ..traverse import bulk_store_tile, footprint, walk

_BARRIERS = (ir.BarrierWait, ir.BarrierArrive, ir.BlockSync)
"""Statements that synchronize with other threads: nothing moves across them but arrivals."""
_ORDERED = (ir.Gemm, ir.GemmWait) + _BARRIERS
"""Statements whose order against in-flight gemms this pass keeps as written."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if kernel.find_plan(AsyncPlan) is None or not config.policy.overlap_gemms:
        return kernel
    released: dict[str, set] = {}
    for ws in (s for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize)):
        released.update(roles.released_buffers(ws))
    return dataclasses.replace(kernel, body=_rewrite(kernel.body, released))


def _rewrite(seq: ir.Seq, released: dict) -> ir.Seq:
    """``seq`` with its nested lists rescheduled first, then itself where it qualifies."""
    stmts = tuple(_rewrite_nested(s, released) for s in seq.stmts)
    if _qualifies(stmts):
        stmts = _place_waits(_hoist_gemms(_without_waits(stmts)), released, seq.loc)
    return dataclasses.replace(seq, stmts=stmts)


def _rewrite_nested(s: ir.Stmt, released: dict) -> ir.Stmt:
    if isinstance(s, ir.WarpSpecialize):
        return dataclasses.replace(s, roles=tuple(_rewrite_nested(r, released) for r in s.roles))
    if isinstance(s, (ir.For, ir.Role)):
        return dataclasses.replace(s, body=_rewrite(s.body, released))
    if isinstance(s, ir.If):
        return dataclasses.replace(s, then=_rewrite(s.then, released), orelse=_rewrite(s.orelse, released))
    return s


def _wgmma(s: ir.Stmt) -> bool:
    return isinstance(s, ir.Gemm) and s.instr is ir.GemmInstr.WGMMA


def _qualifies(stmts: tuple) -> bool:
    """At least two wgmmas, and every wait is a ``gemm_wait 0`` right after a gemm."""
    if sum(_wgmma(s) for s in stmts) < 2:
        return False
    return all(s.outstanding == 0 and i > 0 and _wgmma(stmts[i - 1])
               for i, s in enumerate(stmts) if isinstance(s, ir.GemmWait))


def _without_waits(stmts: tuple) -> list:
    return [s for s in stmts if not isinstance(s, ir.GemmWait)]


def _fixed(s: ir.Stmt) -> bool:
    """Whether nothing may move past ``s``: gemms, waits, synchronization, proxy fences, bulk
    (asynchronous) copies, or a statement holding one."""
    return any(isinstance(t, _ORDERED + (ir.ProxyFence, ir.BulkStoreWait))
               or bulk_store_tile(t) is not None
               or (isinstance(t, ir.Copy) and t.mechanism is ir.CopyMechanism.TMA)
               for t in walk(s))


def _independent(bundle: list, s: ir.Stmt) -> bool:
    """Whether ``s`` and ``bundle`` (a gemm and its barrier wait) may trade places: neither
    writes what the other reads or writes (ring slot counters included)."""
    reads, writes = footprint(*bundle)
    s_reads, s_writes = footprint(s)
    return not (s_writes & (reads | writes) or s_reads & writes)


def _shared_load(s: ir.Stmt) -> bool:
    """Whether ``s`` copies shared memory into a fragment."""
    return isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.SHARED \
        and s.dst.buffer.scope is ir.Scope.FRAGMENT


def _hoist_gemms(stmts: list) -> list:
    """Step 1 of the module docstring."""
    out: list = []
    first = next(s for s in stmts if _wgmma(s))
    for s in stmts:
        out.append(s)
        if not _wgmma(s):
            continue
        bundle, top = [s], len(out) - 1
        while True:
            while top > 0 and not _fixed(out[top - 1]) and _independent(bundle, out[top - 1]):
                top -= 1
                if s is first and _shared_load(out[top]) and \
                        not any(isinstance(b, ir.BarrierWait) for b in bundle):
                    bundle = [out[top]] + bundle    # a load of its slot, met before its wait
            if top == 0 or not isinstance(out[top - 1], ir.BarrierWait) or \
                    any(isinstance(b, ir.BarrierWait) for b in bundle):
                break
            top -= 1                        # the wait for the gemm's ring slot travels with it
            bundle = [out[top]] + bundle
        out[top:] = bundle + [t for t in out[top:] if all(t is not b for b in bundle)]
    return out


def _needs(s: ir.Stmt, gemm: ir.Gemm) -> bool:
    """Whether ``s`` may run only once ``gemm`` has completed."""
    if _wgmma(s):
        return (s.a.buffer == gemm.c.buffer or s.c.buffer in (gemm.a.buffer, gemm.b.buffer)
                or (s.c.buffer == gemm.c.buffer and s.may_clear))
    reads, writes = footprint(s)
    return gemm.c.buffer in reads | writes or bool(writes & {gemm.a.buffer, gemm.b.buffer})


def _place_waits(stmts: list, released: dict, loc: ir.Loc) -> tuple:
    """Steps 2-4 of the module docstring (``loc``: the list's, for its final wait)."""
    out: list = []
    inflight: list[ir.Gemm] = []
    held: list[tuple[ir.BarrierArrive, list]] = []     # arrivals and the gemms they wait for

    def complete(needed: list, at: ir.Loc) -> None:
        nonlocal inflight, held
        newest = max((i for i, g in enumerate(inflight) if any(g is n for n in needed)), default=None)
        if newest is not None:
            out.append(ir.GemmWait(len(inflight) - 1 - newest, at))
            inflight = inflight[newest + 1:]
        while held and not any(g is i for g in held[0][1] for i in inflight):
            out.append(held.pop(0)[0])

    store_waits: list[ir.BulkStoreWait] = []   # step 5: each before the next other statement
    for s in stmts:
        if isinstance(s, ir.BulkStoreWait):
            store_waits.append(s)
            continue
        if isinstance(s, ir.BarrierArrive):
            needed = [g for g in inflight if roles.released_operand(s, g, released) is not None]
            if needed or (held and not s.after_role_barrier) \
                    or any(a.barrier.buffer is s.barrier.buffer for a, _ in held):
                held.append((s, needed))
            else:
                out.extend(store_waits)
                store_waits = []
                out.append(s)
            continue
        sync = isinstance(s, (ir.BarrierWait, ir.BlockSync))
        if sync or footprint(s)[1] & footprint(*(a for a, _ in held))[0]:
            # a barrier wait, or a write of what a held arrival reads (its ring slot counter)
            complete([g for _, gs in held for g in gs], s.loc)
        if any(isinstance(t, _ORDERED) for t in walk(s) if t is not s):
            complete(inflight, s.loc)
        elif not sync:
            complete([g for g in inflight if _needs(s, g)], s.loc)
        out.extend(store_waits)
        store_waits = []
        out.append(s)
        if _wgmma(s):
            inflight.append(s)
    complete(inflight, loc)
    out.extend(store_waits)
    return tuple(out)
