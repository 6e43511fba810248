"""overlap_store: let a tile's bulk store of its result overlap the next tile's main loop.

Requires:  legalize_wgmma made an ``AsyncPlan`` (otherwise the pass does nothing) (every TMA store is followed by
           ``BulkStoreWait(0)``).
Ensures:   in a loop whose body (or a branch in it, not a nested loop) stores a staging buffer
           ``X`` with ``copy frag -> X`` (ordinary stores) ... ``copy X -> global [tma];
           bulk_store_wait 0`` (or a bulk reduce-add ``atomic_add global, X`` in its place:
           dQ's tile in the attention backward's loop), and writes ``X`` no other way (other
           reads of it are free: a partial tile's element stores from ``X``), each such wait after a store of
           ``X`` moves to just before every ``copy frag -> X`` (the only points where ``X`` is
           written again: the next tile's store, in whichever branch it is), and one
           ``bulk_store_wait 0`` follows the loop, before the role ends. Where the body's bulk
           stores are all its own statements and each such ``X`` is stored once, the wait
           before writing ``X`` is ``bulk_store_wait n``, n the bulk stores issued since ``X``'s
           previous store (around the back edge): stores of several staging buffers (a tile's
           parts) stay in flight together; elsewhere ``bulk_store_wait 0``. Loops nested in such
           a loop are rewritten alike, first: a main loop's adds inside a persistent tile loop
           whose own stores are deferred too.
Preserves: program meaning (stores are synchronous in the interpreter; the waits only order the
           asynchronous store's reads of ``X`` before the next writes of ``X``) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..plans import AsyncPlan
from ..config import BackendConfig
from ..traverse import buffers_read, buffers_written, bulk_store_tile, rewrite_loops, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if kernel.find_plan(AsyncPlan) is None:
        return kernel
    return dataclasses.replace(kernel, body=rewrite_loops(kernel.body, _deferred))


def _deferred(loop: ir.For):
    """The loop with its nested loops' waits deferred first (a persistent tile loop around the
    main loop: the tile's own stores and the main loop's adds), then its own; None if neither."""
    inner = rewrite_loops(loop.body, _deferred)
    body = _defer(inner)
    if body is None:
        return None if inner == loop.body else [dataclasses.replace(loop, body=inner)]
    return [dataclasses.replace(loop, body=body), ir.BulkStoreWait(0, loop.loc)]


def _defer(body: ir.Seq):
    """``body`` with the waits after its bulk stores moved before their staging buffers' next
    writes, or None when no staging buffer qualifies."""
    outside_loops = {id(s) for s in walk(body, opaque=(ir.For,))}
    stores = [s for s in walk(body) if _bulk_store(s)]
    deferred = set()
    for staging in {_staging(s) for s in stores}:
        users = [s for s in walk(body) if staging in buffers_read(s) + buffers_written(s)]
        ok = all(id(s) in outside_loops and (_bulk_store(s) or staging not in buffers_written(s) or (
            isinstance(s, ir.Copy) and s.dst.buffer == staging and s.mechanism is ir.CopyMechanism.DIRECT))
            for s in users)
        if ok and all(_waited(body, s) for s in stores if _staging(s) == staging):
            deferred.add(staging)
    if not deferred:
        return None
    return _moved(body, deferred, _newer_stores(body, deferred))


def _waited(seq: ir.Seq, store: ir.Copy) -> bool:
    """Whether ``store`` is followed at once by ``bulk_store_wait 0`` in its statement list (in
    ``seq`` or a branch inside it)."""
    for i, s in enumerate(seq.stmts):
        if s is store:
            return i + 1 < len(seq.stmts) and seq.stmts[i + 1] == ir.BulkStoreWait(0)
        if isinstance(s, ir.If) and (_waited(s.then, store) or _waited(s.orelse, store)):
            return True
    return False


def _moved(seq: ir.Seq, deferred: set, newer: Optional[dict] = None) -> ir.Seq:
    """``newer``: for the loop body's writes of a staging buffer (by position), how many bulk
    stores each wait may leave reading (``_newer_stores``); 0 elsewhere."""
    newer = newer or {}
    out: list[ir.Stmt] = []
    for i, s in enumerate(seq.stmts):
        if s == ir.BulkStoreWait(0) and out and _bulk_store(out[-1]) and _staging(out[-1]) in deferred:
            continue
        if isinstance(s, ir.Copy) and s.dst.buffer in deferred:
            out.append(ir.BulkStoreWait(newer.get(i, 0), s.loc))
        if isinstance(s, ir.If):
            s = dataclasses.replace(s, then=_moved(s.then, deferred), orelse=_moved(s.orelse, deferred))
        out.append(s)
    return dataclasses.replace(seq, stmts=tuple(out))


def _newer_stores(body: ir.Seq, deferred: set) -> dict:
    """Position of each write of a staging buffer in the loop body -> how many bulk stores are
    issued between that buffer's previous store and the write (around the back edge when the
    previous store is later in the body): those may still be reading other buffers. Only where
    every bulk store of the body is one of its own statements and each staging buffer is stored
    once; else {} (waits for all)."""
    stmts = body.stmts
    stores = [i for i, s in enumerate(stmts) if _bulk_store(s)]
    nested = [s for s in stmts if not _bulk_store(s) for x in walk(s) if x is not s and _bulk_store(x)]
    stored = [_staging(stmts[i]) for i in stores]
    if nested or any(stored.count(b) != 1 for b in deferred):
        return {}
    newer = {}
    for p, s in enumerate(stmts):
        if isinstance(s, ir.Copy) and s.dst.buffer in deferred:
            last = stores[stored.index(s.dst.buffer)]
            newer[p] = sum(last < q < p for q in stores) if last < p else \
                sum(q > last or q < p for q in stores)
    return newer


def _bulk_store(s: ir.Stmt) -> bool:
    """A bulk store of a shared tile to global memory, or a bulk reduce-add of one."""
    return bulk_store_tile(s) is not None


def _staging(store: ir.Stmt) -> ir.Buffer:
    """The shared tile a bulk store (or reduce-add) reads."""
    return bulk_store_tile(store).buffer
