"""Asynchronous-MMA discipline of a lowered warp-specialized kernel (docs/ws-semantics.md #5).

The interpreter runs gemms synchronously, so it cannot see a missing wait; this check can. Per
role, in program order (loop bodies checked as written and once more as the loop's next
iteration sees them):

* a ``WGMMA`` gemm is in flight from its issue until a ``GemmWait(n)`` leaves at most ``n`` newer;
* reading or overwriting an in-flight gemm's accumulator (any statement but another gemm into
  it) is an error;
* an arrival on a barrier that another role waits on before writing a buffer an in-flight gemm
  reads — at the same index expression — releases that operand while the gemm may still read it:
  an error;
* a role must not end with gemms in flight;
* an asynchronous read of shared memory (TMA store, wgmma operand) of a buffer the role wrote with
  ordinary stores since its last ``ProxyFence`` is an error (the async proxy may not see them);
* writing a buffer a bulk (TMA) store may still be reading — issued and not covered by a
  ``BulkStoreWait(n)`` issued after it with fewer than n bulk stores newer than it (the wait
  leaves at most the n newest reading) — is an error, and so is ending a role with bulk stores
  in flight.

Violations are ``CompileError`` naming the kernel, the role and the line.
"""
from __future__ import annotations

from . import ir, roles
from .errors import CompileError
from .traverse import (async_shared_reads, buffers_read, buffers_written, bulk_store_tile,
                       generic_shared_writes)


def run(kernel: ir.Kernel) -> ir.Kernel:
    for ws in (s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)):
        guards = roles.released_buffers(ws)
        for role in ws.roles:
            checker = _Role(kernel, role, guards)
            inflight = checker.seq(role.body.stmts, [])
            if checker.storing:
                loc = checker.storing[0][1]
                raise CompileError(f"kernel '{kernel.name}': {roles.describe(role.warpgroups)} ends "
                                   f"with a bulk store in flight (line {loc.line}); wait for it", loc)
            if inflight:
                raise CompileError(f"kernel '{kernel.name}': {roles.describe(role.warpgroups)} ends "
                                   f"with a wgmma in flight (issued at line {inflight[-1].loc.line}); "
                                   f"add a wait", inflight[-1].loc)
    return kernel


class _Role:
    def __init__(self, kernel: ir.Kernel, role: ir.Role, guards: dict[str, set]):
        self.kernel, self.role, self.guards = kernel, role, guards
        self.unfenced: dict[ir.Buffer, ir.Loc] = {}   # generic writes not yet fenced
        self.storing: list[tuple[ir.Buffer, ir.Loc]] = []    # bulk stores not yet waited for,
                                                              # oldest first

    def fail(self, msg: str, loc: ir.Loc) -> CompileError:
        return CompileError(f"kernel '{self.kernel.name}', {roles.describe(self.role.warpgroups)}: "
                            f"{msg}", loc)

    def seq(self, stmts, inflight: list[ir.Gemm]) -> list[ir.Gemm]:
        for s in stmts:
            inflight = self.stmt(s, inflight)
        return inflight

    def stmt(self, s: ir.Stmt, inflight: list[ir.Gemm]) -> list[ir.Gemm]:
        if isinstance(s, ir.ProxyFence):
            self.unfenced.clear()
        for b in async_shared_reads(s):
            if b in self.unfenced:
                raise self.fail(f"reads '{b.name}' through the asynchronous proxy after ordinary "
                                f"stores to it (line {self.unfenced[b].line}) with no proxy fence "
                                f"between", s.loc)
        for b in generic_shared_writes(s):
            reading = [loc for buf, loc in self.storing if buf == b]
            if reading:
                raise self.fail(f"writes '{b.name}' while the bulk store from line "
                                f"{reading[0].line} may still read it (wait first)", s.loc)
            self.unfenced[b] = s.loc
        if isinstance(s, ir.BulkStoreWait):
            self.storing = self.storing[len(self.storing) - s.outstanding:] if s.outstanding else []
        tile = bulk_store_tile(s)
        if tile is not None:
            self.storing.append((tile.buffer, s.loc))
        if isinstance(s, ir.For):
            once = self.seq(s.body.stmts, list(inflight))
            return self.seq(s.body.stmts, once)        # what the next iteration sees
        if isinstance(s, ir.If):
            a = self.seq(s.then.stmts, list(inflight))
            b = self.seq(s.orelse.stmts, list(inflight))
            return a if len(a) >= len(b) else b
        if isinstance(s, ir.GemmWait):
            return inflight[len(inflight) - s.outstanding:] if s.outstanding else []
        if isinstance(s, ir.Gemm):
            for g in inflight:
                if g.c.buffer == s.c.buffer and s.may_clear:
                    raise self.fail(f"the wgmma at line {s.loc.line} overwrites accumulator "
                                    f"'{s.c.buffer.name}' while the one from line {g.loc.line} is "
                                    f"in flight", s.loc)
            return inflight + [s] if s.instr is ir.GemmInstr.WGMMA else inflight
        if isinstance(s, ir.BarrierArrive):
            for g in inflight:
                op = roles.released_operand(s, g, self.guards)
                if op is not None:
                    raise self.fail(f"arrives on '{s.barrier.buffer.name}' releasing "
                                    f"'{op.name}' while the wgmma from line "
                                    f"{g.loc.line} may still read it (wait first)", s.loc)
            return inflight
        touched = set(buffers_read(s)) | set(buffers_written(s))
        for g in inflight:
            if g.c.buffer in touched:
                raise self.fail(f"uses accumulator '{g.c.buffer.name}' while the wgmma from line "
                                f"{g.loc.line} is in flight (wait first)", s.loc)
        return inflight
