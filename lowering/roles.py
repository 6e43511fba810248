"""Warp-specialized programs: which roles a kernel has, and each role's projection.

A role is the set of warp groups of one ``T.ws(...)``. The projection of a program onto a role
keeps that role's statements and the loops and branches around them; allocations are block-wide
and stay outside the roles.
"""
from __future__ import annotations

import dataclasses

from . import ir
from .traverse import buffers_written, walk


def role_sets(body: ir.Stmt) -> tuple[tuple[int, ...], ...]:
    """The distinct ``T.ws`` warp-group sets of a program, ordered by their first warp group."""
    found = {s.warpgroups for s in walk(body) if isinstance(s, ir.Role)}
    return tuple(sorted(found))


def project(s: ir.Stmt, role: tuple[int, ...]) -> ir.Stmt | None:
    """``s`` as seen by ``role``: other roles' statements and allocations removed, loops and
    branches kept where they still hold something. None if nothing is left."""
    if isinstance(s, ir.Seq):
        kept = []
        for t in s.stmts:
            p = project(t, role)
            if p is not None:
                kept.extend(p.stmts if isinstance(p, ir.Seq) else (p,))
        return dataclasses.replace(s, stmts=tuple(kept)) if kept else None
    if isinstance(s, ir.Role):
        return s.body if s.warpgroups == role else None
    if isinstance(s, ir.For):
        body = project(s.body, role)
        return None if body is None else dataclasses.replace(s, body=body)
    if isinstance(s, ir.If):
        then, orelse = project(s.then, role), project(s.orelse, role)
        if then is None and orelse is None:
            return None
        empty = ir.Seq((), s.loc)
        return dataclasses.replace(s, then=then or empty, orelse=orelse or empty)
    return None  # un-roled leaves: allocations (hoisted by split) — verify rejects anything else


def split(kernel: ir.Kernel) -> ir.Kernel:
    """Source form (``Role`` blocks inside the program) -> block-wide allocations followed by one
    ``WarpSpecialize`` holding each role's projection, with the register count its blocks
    requested (``Role.num_regs``). A kernel without roles is returned as is."""
    if any(isinstance(s, ir.WarpSpecialize) for s in walk(kernel.body)):
        return kernel  # already split
    roles = role_sets(kernel.body)
    if not roles:
        return kernel
    allocs = tuple(s for s in walk(kernel.body) if isinstance(s, ir.Alloc) and not _inside_role(kernel.body, s))
    requested = {s.warpgroups: s.num_regs for s in walk(kernel.body)
                 if isinstance(s, ir.Role) and s.num_regs}
    projected = tuple(ir.Role(r, _as_seq(project(kernel.body, r), kernel.loc), loc=kernel.loc,
                              num_regs=requested.get(r, 0))
                      for r in roles)
    body = ir.Seq(allocs + (ir.WarpSpecialize(projected, kernel.loc),), kernel.body.loc)
    return dataclasses.replace(kernel, body=body)


def _as_seq(s, loc) -> ir.Seq:
    return s if isinstance(s, ir.Seq) else ir.Seq(() if s is None else (s,), loc)


def _inside_role(body: ir.Stmt, target: ir.Stmt) -> bool:
    return any(target in tuple(walk(r.body)) for r in walk(body) if isinstance(r, ir.Role))


def streams(kernel: ir.Kernel):
    """(block-wide allocations, [(role name, threads, body)]): what runs concurrently in a block.
    A kernel with roles is split first, each role running with ``128 * len(warpgroups)``
    threads; a kernel without roles is one stream of ``kernel.threads`` threads."""
    if not any(isinstance(s, ir.WarpSpecialize) for s in walk(kernel.body)):
        kernel = split(kernel)
    stmts = kernel.body.stmts
    ws = [s for s in stmts if isinstance(s, ir.WarpSpecialize)]
    if not ws:
        return (), [(f"the block ({kernel.threads} threads)", kernel.threads, kernel.body)]
    others = [s for s in stmts if not isinstance(s, (ir.WarpSpecialize, ir.Alloc))]
    if len(ws) > 1 or others:
        raise ValueError(f"{kernel.loc}: a warp-specialized kernel body must be allocations "
                         f"followed by one WarpSpecialize")
    allocs = tuple(s for s in stmts if isinstance(s, ir.Alloc))
    return allocs, [(describe(r.warpgroups), role_threads(r.warpgroups), r.body)
                    for r in ws[0].roles]


def role_threads(role: tuple[int, ...]) -> int:
    return 128 * len(role)


def describe(warpgroups: tuple[int, ...]) -> str:
    """``T.ws(1, 2)`` as the user wrote it."""
    return f"T.ws({', '.join(map(str, warpgroups))})"


def released_buffers(ws: ir.WarpSpecialize) -> dict[str, set]:
    """barrier name -> shared buffers some role writes after waiting on that barrier: what an
    arrival on it releases to that role (a fragment is its role's own: no arrival releases it)."""
    guards: dict[str, set] = {}
    for role in ws.roles:
        waited: list[str] = []
        for s in walk(role.body):
            if isinstance(s, ir.BarrierWait):
                waited.append(s.barrier.buffer.name)
            elif waited:
                for b in (b for b in buffers_written(s) if b.scope is ir.Scope.SHARED):
                    guards.setdefault(waited[-1], set()).add(b)
    return guards


def released_operand(arrive: ir.BarrierArrive, gemm: ir.Gemm, released: dict[str, set]):
    """The shared operand of ``gemm`` that ``arrive`` hands to the role writing it next (the ring
    slot the gemm reads, at the same index expression), or None (``released``:
    ``released_buffers``)."""
    freed = released.get(arrive.barrier.buffer.name, set())
    return next((op.buffer for op in (gemm.a, gemm.b)
                 if op.buffer in freed and op.starts[:1] == (arrive.barrier.index,)), None)
