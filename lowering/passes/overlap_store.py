"""overlap_store: let a tile's bulk store of its result overlap the next tile's main loop.

Requires:  legalize_wgmma made an ``AsyncPlan`` (otherwise the pass does nothing) (every TMA store is followed by
           ``BulkStoreWait(0)``).
Ensures:   in a loop whose body stores a staging buffer ``X`` with ``copy frag -> X`` (ordinary
           stores) ... ``copy X -> global [tma]; bulk_store_wait 0``, the wait moves to just before
           the next iteration's ``copy frag -> X`` (the only point where ``X`` is written again),
           and one ``bulk_store_wait 0`` follows the loop, before the role ends.
Preserves: program meaning (stores are synchronous in the interpreter; the waits only order the
           asynchronous store's reads of ``X`` before the next writes of ``X``) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..plans import AsyncPlan
from ..target import Target
from ..traverse import rewrite_loops


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    if kernel.find_plan(AsyncPlan) is None:
        return kernel
    return dataclasses.replace(kernel, body=rewrite_loops(kernel.body, _deferred))


def _deferred(loop: ir.For):
    body = _defer(loop.body)
    return None if body is None else [dataclasses.replace(loop, body=body), ir.BulkStoreWait(0, loop.loc)]


def _defer(body: ir.Seq):
    """``body`` with its store wait moved before the staging buffer's next write, or None."""
    stmts = list(body.stmts)
    for i, s in enumerate(stmts[:-1]):
        if not (_bulk_store(s) and stmts[i + 1] == ir.BulkStoreWait(0)):
            continue
        staging = s.src.buffer
        writes = [j for j, t in enumerate(stmts) if isinstance(t, ir.Copy) and t.dst.buffer == staging
                  and t.mechanism is ir.CopyMechanism.DIRECT]
        if len(writes) != 1 or writes[0] > i:
            return None
        w = writes[0]
        return dataclasses.replace(body, stmts=tuple(
            stmts[:w] + [ir.BulkStoreWait(0, stmts[w].loc)] + stmts[w:i + 1] + stmts[i + 2:]))
    return None


def _bulk_store(s: ir.Stmt) -> bool:
    return (isinstance(s, ir.Copy) and s.mechanism is ir.CopyMechanism.TMA
            and s.dst.buffer.scope is ir.Scope.GLOBAL)
