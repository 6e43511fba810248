"""split_consumers: give each warp group of an automatic consumer its own rows, as its own role.

A consumer of two warp groups run as one role is one Gluon partition: every barrier arrival
synchronizes both warp groups, so they issue their gemms and run their softmax in lockstep and
the tensor cores idle while both do fragment math. As two roles (one per warp group, each with
half of the tile's rows) they only meet at the producer's barriers, and drift apart by one gemm:
one warp group's softmax runs under the other's gemms (the ping-pong FlashAttention-3 arranges
with named barriers).

Requires:  warp_specialize has run; applies on targets with ``wgmma`` (and ``split_consumers``)
           to kernels with a ``PipelinePlan`` (the automatic schedule), persistent ones included.
Ensures:   when the consumer role ``ws(1, 2)`` does fragment math (a ``T.Parallel`` or a
           reduction) inside its innermost loop (not only in a persistent tile's epilogue),
           keeps all its fragments with BM rows in dim 0 (BM a multiple of 128), reads shared
           tiles of BM rows (dim 0; dim 1 of a ring buffer, whose dim 0 is the slot) only as the
           A operand of its gemms
           (and writes / stores such buffers only whole, through fragment -> shared copies and
           shared -> global copies; other roles may only fill them from global memory), indexes every fragment inside a ``T.Parallel`` with the
           loop's first variable in dim 0 — it becomes roles ``ws(1)`` and ``ws(2)``: role h has
           fragments ``<name>_h`` of BM / 2 rows, reads and writes rows [h BM / 2, (h + 1) BM / 2)
           of those shared buffers and of the global tile they are stored to, and its parallel
           loops run over BM / 2 rows with the row index shifted by h BM / 2 outside fragment
           accesses (masks read the true row); each role has its own copy of the consumer's
           local buffers (a guarded loop's iteration counter). A consumer with a block-level
           atomic (one add per block) stays one role. Barrier arrivals are counted in
           threads, so the two roles together arrive as the one did. Anything else is unchanged, with a note.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..plans import PipelinePlan
from ..target import Target
from ..traverse import buffers_read, buffers_written, element_accesses, touched, transform, walk

_HALVES = 2


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    plan = kernel.find_plan(PipelinePlan)
    if not (target.wgmma and target.split_consumers) or plan is None:
        return kernel
    wss = [s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)]
    consumer = next((r for ws in wss for r in ws.roles if r.warpgroups == (1, 2)), None)
    if consumer is None:
        return kernel
    rows, why = _rows(kernel, consumer)
    if rows is None:
        return kernel.with_note(f"split_consumers: the consumer keeps both warp groups in one role: {why}")
    # registers: fragments (split by rows) and locals (a guarded loop's iteration counter: each
    # role keeps its own copy)
    used = touched(consumer.body)
    owned = [s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)       # in allocation
             and s.buffer.scope in (ir.Scope.FRAGMENT, ir.Scope.LOCAL) and s.buffer in used]  # order
    shared = _row_shared(consumer)
    halves, allocs = [], []
    for h in range(_HALVES):
        renamed = {b: dataclasses.replace(b, name=f"{b.name}_{h}", shape=(
            (ir.Const(rows // _HALVES, ir.DType.I32, b.loc),) + b.shape[1:] if b.scope is ir.Scope.FRAGMENT
            else b.shape)) for b in owned}
        allocs += [ir.Alloc(b, b.loc) for b in renamed.values()]
        body = _half(consumer.body, h * rows // _HALVES, rows // _HALVES, renamed, shared)
        halves.append(dataclasses.replace(consumer, warpgroups=(h + 1,), body=body))
    top = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.Alloc) and s.buffer in owned:
            continue
        if isinstance(s, ir.WarpSpecialize):
            roles = tuple(r for c in s.roles for r in (halves if c is consumer else [c]))
            s = dataclasses.replace(s, roles=roles)
        top.append(s)
    allocs_end = max(k for k, s in enumerate(top) if isinstance(s, ir.Alloc)) + 1
    body = ir.Seq(tuple(top[:allocs_end] + allocs + top[allocs_end:]), kernel.body.loc)
    return dataclasses.replace(kernel, body=body).with_note(
        f"split_consumers: the consumer's {rows} rows are split between roles ws(1) and ws(2), "
        f"{rows // _HALVES} each, so one warp group's fragment math runs under the other's gemms")


def _row_dim(b: ir.Buffer) -> int:
    """The rows of a shared tile: dim 0 of a tile, dim 1 of a ring of tiles (dim 0: the slot)."""
    return len(b.shape) - 2


def _row_shared(role: ir.Role) -> set:
    """Shared buffers the role reads as gemm A operands or writes from fragments."""
    out = set()
    for s in walk(role.body):
        if isinstance(s, ir.Gemm) and s.a.buffer.scope is ir.Scope.SHARED:
            out.add(s.a.buffer)
        if isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.FRAGMENT \
                and s.dst.buffer.scope is ir.Scope.SHARED:
            out.add(s.dst.buffer)
    return out


def _rows(kernel: ir.Kernel, role: ir.Role) -> tuple[Optional[int], str]:
    """BM, or None and why the role cannot be split."""
    gemms = [s for s in walk(role.body) if isinstance(s, ir.Gemm)]
    if not gemms:
        return None, "it computes no gemm"
    inner = [s for s in walk(role.body) if isinstance(s, ir.For)
             and not any(isinstance(t, ir.For) for t in walk(s.body))]      # not a tile loop
    if not any(isinstance(t, (ir.Parallel, ir.Reduce)) for lp in inner for t in walk(lp.body)):
        return None, "its loop does no fragment math to overlap (a plain GEMM keeps one merged role)"
    rows = gemms[0].c.tile_shape[0]
    if rows % (64 * _HALVES):
        return None, f"its {rows}-row tile does not split into 64-row halves"
    shared = _row_shared(role)
    for s in walk(role.body, opaque=(ir.Parallel,)):
        if isinstance(s, ir.AtomicAdd):
            return None, f"the atomic at line {s.loc.line} is one per block; two roles would each add"
    for s in walk(role.body):
        if isinstance(s, ir.Gemm):
            if s.transpose_a or s.b.buffer in shared:
                return None, f"the gemm at line {s.loc.line} reads a row-split buffer as B or transposed"
        for b in buffers_read(s) + buffers_written(s):
            if b.scope is ir.Scope.FRAGMENT and ir.as_int(b.shape[0]) != rows:
                return None, f"fragment '{b.name}' does not have {rows} rows in dim 0"
            if b in shared and ir.as_int(b.shape[_row_dim(b)]) != rows:
                return None, f"shared buffer '{b.name}' does not have {rows} rows"
        if isinstance(s, ir.Copy) and (s.src.buffer in shared or s.dst.buffer in shared):
            r = s.src if s.src.buffer in shared else s.dst
            if not r.is_whole:
                return None, f"the copy at line {s.loc.line} uses part of '{r.buffer.name}'"
            other = s.dst if r is s.src else s.src
            if other.buffer.scope not in (ir.Scope.FRAGMENT, ir.Scope.GLOBAL):
                return None, f"the copy at line {s.loc.line} moves '{r.buffer.name}' within shared memory"
        if isinstance(s, ir.Parallel):
            for t in walk(s.body):
                for b, idx in element_accesses(t):
                    if b.scope is ir.Scope.FRAGMENT and (not idx or idx[0] != s.vars[0]):
                        return None, (f"the T.Parallel at line {s.loc.line} indexes a fragment's "
                                      f"rows with something other than its first variable")
    for ws in (s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)):
        for r in (r for r in ws.roles if r is not role):
            for s in walk(r.body):
                used = set(buffers_read(s) + buffers_written(s)) & shared
                loads = isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.GLOBAL
                if used and not loads:     # the producer may fill them whole (Q); nothing else
                    return None, f"line {s.loc.line} of another role uses '{used.pop().name}'"
    return rows, ""


def _half(body: ir.Seq, offset: int, size: int, renamed: dict, shared: set) -> ir.Seq:
    """The role's body restricted to rows [offset, offset + size)."""
    c = lambda v, loc: ir.Const(v, ir.DType.I32, loc)  # noqa: E731

    def shift_parallel(p: ir.Parallel) -> ir.Parallel:
        # each half's loop variables get names of their own (layout frames are keyed by them)
        fresh = {v: dataclasses.replace(v, name=f"{v.name}_h{offset}") for v in p.vars}
        p = dataclasses.replace(p, vars=tuple(fresh.values()),
                                body=transform(p.body, lambda n: fresh.get(n) if isinstance(n, ir.Var) else None))
        i = p.vars[0]
        moved = ir.BinOp(ir.BinOpKind.ADD, i, c(offset, p.loc), ir.DType.I32, p.loc)
        inner = transform(p.body, lambda n: moved if n == i else None)

        def back(n):          # fragment rows stay indexed by the loop variable itself
            if isinstance(n, (ir.Load, ir.Store)) and n.buffer.scope is ir.Scope.FRAGMENT \
                    and n.indices[0] == moved:
                return dataclasses.replace(n, indices=(i,) + n.indices[1:])
            return None
        return dataclasses.replace(p, body=transform(inner, back), extents=(size,) + p.extents[1:])

    def fn(n):
        if isinstance(n, ir.Buffer):
            return renamed.get(n)
        if isinstance(n, ir.Parallel):
            return shift_parallel(n)
        if isinstance(n, ir.Region) and n.buffer.scope is ir.Scope.FRAGMENT:
            return dataclasses.replace(n, extents=(size,) + tuple(n.extents[1:]))
        if isinstance(n, ir.Region) and n.buffer in shared:
            d = _row_dim(n.buffer)
            return dataclasses.replace(n, starts=n.starts[:d] + (c(offset, n.loc),) + n.starts[d + 1:],
                                       extents=n.extents[:d] + (size,) + n.extents[d + 1:])
        if isinstance(n, ir.Copy) and n.src.buffer in shared and n.dst.buffer.scope is ir.Scope.GLOBAL:
            d = next(k for k, e in enumerate(n.dst.extents) if e != 1)     # the tile's row dim
            start = ir.BinOp(ir.BinOpKind.ADD, n.dst.starts[d], c(offset, n.loc), ir.DType.I32, n.loc)
            dst = dataclasses.replace(n.dst, starts=n.dst.starts[:d] + (start,) + n.dst.starts[d + 1:],
                                      extents=n.dst.extents[:d] + (size,) + n.dst.extents[d + 1:])
            return dataclasses.replace(n, dst=dst)
        return None
    return transform(body, fn)
