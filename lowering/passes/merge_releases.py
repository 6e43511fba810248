"""merge_releases: ring slots a role releases together get one barrier, so each release costs one
arrival (and, on Gluon, one barrier of the role's threads before it) instead of one per slot.

Requires:  the schedule is final (after overlap_gemms, which places the releases);
           ``config.policy.merge_releases`` is on (``TILEWS_MERGE_RELEASES``; otherwise the pass
           does nothing).
Ensures:   where every arrival on a barrier E2 comes right after an arrival on a barrier E1 in
           the same statement list, at the same index expression, every arrival on E1 comes right
           before one on E2 that way, and E1 and E2 are allocated at the kernel's top level with
           the same shape and arrival counts (warp_specialize's ``empty`` barriers of two ring
           groups whose releases overlap_gemms put together: the attention backward's Q and dO
           slots), E2's arrivals are gone, its waits wait on E1 at the same index and parity, and
           its allocation is gone. Anything else: unchanged.
Preserves: program meaning: E1 and E2 completed their phases together (each arrival on one had
           its twin on the other, with nothing between), so E1's phase history is E2's and a
           wait on E1 passes exactly when the same wait on E2 did. Locations.

On the attention backward's D64 consumer loop (sm_90a) this takes one ``BAR.SYNC`` and one
``SYNCS.ARRIVE`` per query block: Triton puts a barrier between two ``mbarrier.arrive`` anyway.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..config import BackendConfig
from ..traverse import rewrite_pairs, substmts, transform, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if not config.policy.merge_releases:
        return kernel
    top = {s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)}
    merged = {}
    for e1, e2 in _twins(kernel, top):
        if e1 not in merged and e2 not in merged and e1 not in merged.values():
            merged[e2] = e1
    if not merged:
        return kernel

    def drop_twin(a: ir.Stmt, b: ir.Stmt):
        if _arrival(a) is not None and _arrival(b) is not None \
                and merged.get(b.barrier.buffer) == a.barrier.buffer:
            return [a]
        return None

    body, _ = rewrite_pairs(kernel.body, drop_twin)
    body = dataclasses.replace(body, stmts=tuple(
        s for s in body.stmts if not (isinstance(s, ir.Alloc) and s.buffer in merged)))
    body = transform(body, lambda n: merged.get(n) if isinstance(n, ir.Buffer) else None)
    names = ", ".join(f"'{e2.name}' into '{e1.name}'" for e2, e1 in merged.items())
    return dataclasses.replace(kernel, body=body).with_note(
        f"merge_releases: barriers released together merged ({names}): one arrival per release")


def _arrival(s: ir.Stmt):
    return s if isinstance(s, ir.BarrierArrive) else None


def _twins(kernel: ir.Kernel, top: set) -> list[tuple[ir.Buffer, ir.Buffer]]:
    """(E1, E2) pairs of the contract: every arrival on either is one of an adjacent pair
    ``arrive E1[x]; arrive E2[x]``."""
    pairs: dict[tuple, int] = {}
    arrivals: dict[ir.Buffer, int] = {}
    for s in walk(kernel.body):
        if isinstance(s, ir.BarrierArrive):
            arrivals[s.barrier.buffer] = arrivals.get(s.barrier.buffer, 0) + 1
        for seq in substmts(s):
            for a, b in zip(seq.stmts, seq.stmts[1:]):
                if _arrival(a) is not None and _arrival(b) is not None \
                        and a.barrier.buffer != b.barrier.buffer and a.barrier.index == b.barrier.index:
                    key = (a.barrier.buffer, b.barrier.buffer)
                    pairs[key] = pairs.get(key, 0) + 1
    return [(e1, e2) for (e1, e2), n in pairs.items()
            if e1 in top and e2 in top and arrivals[e1] == arrivals[e2] == n
            and e1.shape == e2.shape and e1.arrive_counts == e2.arrive_counts]

