"""double_buffer: a ``T.Pipelined`` loop on a target without asynchronous copies loads the next
tile into a second shared buffer while it computes on this one (Metal).

Requires:  legalize_metal has run (``FragmentStoragePlan``: the block's shared bytes). In the pipelines of
           backends without asynchronous copies (metal).
Ensures:   a ``T.Pipelined`` loop with ``num_stages >= 2`` and step 1 whose body is a run of copies
           from global memory into whole shared buffers (the producers, each buffer filled by one
           of them and used nowhere but in this loop) followed by statements that never write those
           buffers (the consumers) becomes, when a second copy of those buffers fits the target's
           shared memory (else the loop is left alone, with a note)::

               if start < stop:      producers(start)     -> buffers 0
               for k in range(start, stop, 2):             (serial)
                   if k + 1 < stop:  producers(k + 1)     -> buffers 1
                   consumers(k)                           on buffers 0
                   if k + 2 < stop:  producers(k + 2)     -> buffers 0
                   if k + 1 < stop:  consumers(k + 1)     on buffers 1

           Buffers 0 are the program's; buffers 1 are new shared buffers ``<name>_1`` (added to the
           ``SharedMemoryPlan`` and the ``FragmentStoragePlan``'s byte count). Each tile's loads
           are issued before the previous tile's consumers, and as the two halves use different
           buffers, ``insert_syncs`` puts one block barrier per tile where the loop as written
           needs two. Copies keep their mechanisms: a substituted producer runs only for indices
           the original loop reaches.
Preserves: program meaning (each tile is loaded before its consumers and overwritten only after
           them, in program order), every node's loc, and the keys of the ``FragmentStoragePlan``'s
           per-statement decisions: a repeated consumer keeps its ``T.Parallel`` variables, its
           reductions' results and its copies' matrix sources, destinations and extents (only
           indices and the producers' buffers, which consumers never write, are substituted).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..plans import FragmentStoragePlan, SharedMemoryPlan
from ..config import BackendConfig
from ..traverse import buffers_read, buffers_written, footprint, fresh_name, rewrite_loops, transform, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    state = {"kernel": kernel, "notes": []}
    body = rewrite_loops(kernel.body, lambda loop: _rewrite(loop, state, config))
    kernel = dataclasses.replace(state["kernel"], body=body)
    for n in state["notes"]:
        kernel = kernel.with_note(n)
    return kernel


def _split(loop: ir.For, kernel: ir.Kernel) -> Optional[tuple[list, list]]:
    """(producers, consumers) of a loop this pass takes, else None."""
    if loop.kind is not ir.ForKind.PIPELINED or loop.num_stages < 2 or ir.as_int(loop.step) != 1:
        return None
    stmts = list(loop.body.stmts)
    n = 0
    while n < len(stmts) and _producer(stmts[n]):
        n += 1
    producers, consumers = stmts[:n], stmts[n:]
    filled = [p.dst.buffer for p in producers]
    if not producers or not consumers or len(set(filled)) != len(filled):
        return None
    if set(filled) & footprint(*consumers)[1]:
        return None
    inside = {id(t) for s in stmts for t in walk(s)}
    for t in walk(kernel.body):
        if id(t) not in inside and not isinstance(t, (ir.Alloc, ir.For, ir.If)) and \
                any(b in filled for b in buffers_read(t) + buffers_written(t)):
            return None
    return producers, consumers


def _producer(s: ir.Stmt) -> bool:
    return (isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.GLOBAL
            and s.dst.buffer.scope is ir.Scope.SHARED and s.dst.is_whole)


def _rewrite(loop: ir.For, state: dict, config: BackendConfig) -> Optional[list]:
    kernel = state["kernel"]
    split = _split(loop, kernel)
    if split is None:
        return None
    producers, consumers = split
    buffers = [p.dst.buffer for p in producers]
    extra = sum(b.nbytes for b in buffers)
    storage = kernel.plan(FragmentStoragePlan)
    if storage.shared_bytes + extra > config.caps.smem_bytes:
        state["notes"].append(f"double_buffer: the loop at line {loop.loc.line} runs single-buffered: "
                              f"a second copy of {', '.join(b.name for b in buffers)} ({extra} bytes) "
                              f"does not fit the {config.caps.smem_bytes} bytes of shared memory")
        return None
    second = {b: dataclasses.replace(b, name=fresh_name(kernel, b.name + "_1")) for b in buffers}
    shared = kernel.plan(SharedMemoryPlan)
    for b in second.values():
        shared = shared.placed(b.name, b.nbytes, 128)
    kernel = kernel.with_plan(shared)
    kernel = kernel.with_plan(dataclasses.replace(storage, shared_bytes=storage.shared_bytes + extra))
    state["kernel"] = kernel

    k, loc = loop.var, loop.loc
    one = ir.Const(1, k.dtype, loc)
    two = ir.Const(2, k.dtype, loc)

    def at(stmts, index: Optional[ir.Expr], into: Optional[dict] = None) -> list:
        out = []
        for s in stmts:
            if index is not None:
                s = transform(s, lambda n: index if n == k else None)
            if into:
                s = transform(s, lambda n: into.get(n) if isinstance(n, ir.Buffer) else None)
            out.append(s)
        return out

    def guarded(cond: ir.Expr, stmts: list) -> ir.If:
        return ir.If(cond, ir.Seq(tuple(stmts), loc), ir.Seq((), loc), loc)

    def plus(n: ir.Const) -> ir.Expr:
        return ir.BinOp(ir.BinOpKind.ADD, k, n, k.dtype, loc)

    def before_stop(e: ir.Expr) -> ir.Expr:
        return ir.Cmp(ir.CmpKind.LT, e, loop.stop, loc)

    allocs = [ir.Alloc(b, b.loc) for b in second.values()]
    prologue = guarded(before_stop(loop.start), at(producers, loop.start))
    body = [guarded(before_stop(plus(one)), at(producers, plus(one), second)),
            *consumers,
            guarded(before_stop(plus(two)), at(producers, plus(two))),
            guarded(before_stop(plus(one)), at(consumers, plus(one), second))]
    doubled = dataclasses.replace(loop, step=two, kind=ir.ForKind.SERIAL, num_stages=0,
                                  body=ir.Seq(tuple(body), loop.body.loc))
    return allocs + [prologue, doubled]
