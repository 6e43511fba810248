"""insert_syncs: block barriers where threads share memory across statements.

Requires:  nothing. Fragments count as shared memory where ``legalize_metal``'s
           ``FragmentStoragePlan`` puts them there; without that plan every fragment is registers
           (the interpreter's thread-level kernels: a per-thread fragment is only ever indexed by
           its own thread's indices). In the pipelines of backends that spell block barriers
           between statements that share on-chip memory (metal: every kernel) and of the
           interpreter (kernels holding per-thread code, ``Parallel(per_thread=True)``: it checks
           that code with the barriers a SIMT target needs).
Ensures:   between any two statements A (earlier) and B of one thread stream where A writes memory
           that B reads or writes, or A reads memory B writes, a ``BlockSync`` stands on every path
           from A to B (including around loops, from one iteration's tail to the next's head), for
           the memory other threads may touch: shared buffers, fragments held in shared memory, and
           global buffers (a sync after global writes is ``device``: it makes them visible too).
           Memory each thread keeps to itself (fragments in registers, replicated or in simdgroup
           matrices) needs none. A ``T.Parallel`` loop is one statement (its iterations are
           independent; a per-thread one's iterations are the threads, and two of its statements
           that share memory are two loops, ``frontend/threads.py``). Hazards are by buffer, not
           element: threads touching only their own elements still get a sync. Syncs are placed
           just before B, and only where a hazard is pending since the last sync; for what is
           pending, an ``if`` counts as one statement (its condition is uniform), so the sync
           stands before it rather than in one branch.
Preserves: program meaning and every node's loc (a sync takes B's loc).
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..plans import FragmentStoragePlan
from ..config import BackendConfig
from ..traverse import buffers_read, buffers_written, walk

Pending = tuple[frozenset, frozenset]     # (buffers read, buffers written) since the last sync
NONE: Pending = (frozenset(), frozenset())


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    plan = kernel.find_plan(FragmentStoragePlan)
    shared = {name for name, where in plan.storage if where == "shared"} if plan is not None else set()
    body, _ = _Syncs(shared).seq(kernel.body, NONE)
    return dataclasses.replace(kernel, body=body)


class _Syncs:
    def __init__(self, shared_fragments: set[str]):
        self.shared_fragments = shared_fragments

    def tracked(self, buffers) -> frozenset:
        return frozenset(b for b in buffers if b.scope in (ir.Scope.SHARED, ir.Scope.GLOBAL)
                         or b.name in self.shared_fragments)

    def seq(self, s: ir.Seq, pending: Pending) -> tuple[ir.Seq, Pending]:
        out = []
        for t in s.stmts:
            t, pending = self.stmt(t, pending, out)
            out.append(t)
        return dataclasses.replace(s, stmts=tuple(out)), pending

    def stmt(self, s: ir.Stmt, pending: Pending, out: list) -> tuple[ir.Stmt, Pending]:
        if isinstance(s, ir.For):
            return self._loop(s, pending, out)
        if isinstance(s, ir.If):
            # the condition is the same in every thread, so a sync the branch needs for what is
            # pending goes before the `if`, where every path passes it
            reads, writes = self._access(walk(s))
            pending = self._sync_before(s, pending, reads, writes, out)
            then, a = self.seq(s.then, pending)
            orelse, b = self.seq(s.orelse, pending)
            return dataclasses.replace(s, then=then, orelse=orelse), _union(a, b)
        reads, writes = self._access(walk(s))
        pending = self._sync_before(s, pending, reads, writes, out)
        return s, (pending[0] | reads, pending[1] | writes)

    def _loop(self, s: ir.For, pending: Pending, out: list) -> tuple[ir.Stmt, Pending]:
        reads, writes = self._access([s])        # the bounds
        pending = self._sync_before(s, pending, reads, writes, out)
        entry = pending
        while True:     # iterations: what the tail of one leaves pending reaches the next's head
            body, tail = self.seq(s.body, entry)
            grown = _union(entry, tail)
            if grown == entry:
                break
            entry = grown
        return dataclasses.replace(s, body=body), _union(entry, tail)

    def _access(self, stmts) -> tuple[frozenset, frozenset]:
        reads, writes = set(), set()
        for t in stmts:
            reads |= self.tracked(buffers_read(t))
            writes |= self.tracked(buffers_written(t))
        return frozenset(reads), frozenset(writes)

    def _sync_before(self, s: ir.Stmt, pending: Pending, reads, writes, out: list) -> Pending:
        hazards = (pending[1] & (reads | writes)) | (pending[0] & writes)
        if not hazards:
            return pending
        # every barrier orders execution; global writes pending since the last one must also be
        # made visible (the sync resets everything pending)
        device = any(b.scope is ir.Scope.GLOBAL for b in pending[1])
        out.append(ir.BlockSync(device, s.loc))
        return NONE


def _union(a: Pending, b: Pending) -> Pending:
    return a[0] | b[0], a[1] | b[1]
