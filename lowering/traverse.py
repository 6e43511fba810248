"""Generic traversal of Tile IR statements: walking and bottom-up rewriting.

Passes use these instead of writing their own recursion over every statement kind.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Optional

from . import ir


def substmts(s: ir.Stmt) -> tuple[ir.Seq, ...]:
    """The statement bodies directly nested in ``s``."""
    if isinstance(s, (ir.For, ir.Parallel, ir.Role)):
        return (s.body,)
    if isinstance(s, ir.If):
        return (s.then, s.orelse)
    if isinstance(s, ir.WarpSpecialize):
        return tuple(r.body for r in s.roles)
    if isinstance(s, ir.Seq):
        return (s,)
    return ()


def rewrite_loops(body: ir.Seq, fn: Callable[[ir.For], Optional[list]]) -> ir.Seq:
    """Offer every loop in ``body`` (inside roles and other loops) to ``fn``, outermost first:
    it returns the statements replacing the loop, or None to look inside it instead."""
    out: list[ir.Stmt] = []
    for s in body.stmts:
        if isinstance(s, ir.WarpSpecialize):
            s = dataclasses.replace(s, roles=tuple(dataclasses.replace(r, body=rewrite_loops(r.body, fn))
                                                   for r in s.roles))
        elif isinstance(s, ir.For):
            new = fn(s)
            if new is not None:
                out.extend(new)
                continue
            s = dataclasses.replace(s, body=rewrite_loops(s.body, fn))
        out.append(s)
    return dataclasses.replace(body, stmts=tuple(out))


def rewrite_pairs(node, fn: Callable[[ir.Stmt, ir.Stmt], Optional[list]]) -> tuple:
    """Offer each two adjacent statements of every statement list in ``node`` to ``fn(a, b)``:
    it returns the statements replacing the pair, or None to keep it (the scan goes on after
    a replacement). Returns (the rebuilt node, the line of each rewritten pair's second
    statement)."""
    lines: list[int] = []

    def seq(n):
        if not isinstance(n, ir.Seq):
            return None
        stmts, changed, i = list(n.stmts), False, 0
        while i + 1 < len(stmts):
            new = fn(stmts[i], stmts[i + 1])
            if new is None:
                i += 1
                continue
            lines.append(stmts[i + 1].loc.line)
            stmts[i:i + 2] = new
            changed = True
            i += len(new)
        return dataclasses.replace(n, stmts=tuple(stmts)) if changed else None

    return transform(node, seq), lines


def whole_store(s: ir.Stmt) -> Optional[ir.Store]:
    """The one statement of a ``T.Parallel`` nest that stores each element of a buffer's whole
    shape at the nest's own variables (``B[i, j] = value`` over B's shape), else None."""
    if not (isinstance(s, ir.Parallel) and len(s.body.stmts) == 1 and isinstance(s.body.stmts[0], ir.Store)):
        return None
    store = s.body.stmts[0]
    return store if store.indices == s.vars and store.buffer.static_shape == s.extents else None


def walk(s: ir.Stmt, opaque: tuple = ()) -> Iterator[ir.Stmt]:
    """Every statement in ``s`` (pre-order), ``Seq`` nodes excluded; statements of the types in
    ``opaque`` are yielded but not entered."""
    if isinstance(s, ir.Seq):
        for t in s.stmts:
            yield from walk(t, opaque)
        return
    yield s
    if isinstance(s, opaque):
        return
    if isinstance(s, ir.WarpSpecialize):
        for r in s.roles:
            yield from walk(r, opaque)
        return
    for body in substmts(s):
        yield from walk(body, opaque)


def per_thread_code(s: ir.Stmt) -> bool:
    """Whether ``s`` holds code the program wrote per thread (a ``Parallel(per_thread=True)``)."""
    return any(isinstance(t, ir.Parallel) and t.per_thread for t in walk(s))


def rewrite(s: ir.Stmt, fn: Callable[[ir.Stmt], Optional[ir.Stmt]], opaque: tuple = ()) -> ir.Stmt:
    """Rebuild ``s`` bottom-up: children first, then ``fn`` on the rebuilt node; statements of
    the types in ``opaque`` are offered to ``fn`` but not entered (as ``walk``'s).

    ``fn`` returns a replacement (a ``Seq`` is spliced into its parent), or None to keep the node.
    """
    if isinstance(s, ir.Seq):
        out: list[ir.Stmt] = []
        for t in s.stmts:
            r = rewrite(t, fn, opaque)
            out.extend(r.stmts if isinstance(r, ir.Seq) else (r,))
        return dataclasses.replace(s, stmts=tuple(out))
    if isinstance(s, opaque):
        pass
    elif isinstance(s, (ir.For, ir.Parallel, ir.Role)):
        s = dataclasses.replace(s, body=rewrite(s.body, fn, opaque))
    elif isinstance(s, ir.If):
        s = dataclasses.replace(s, then=rewrite(s.then, fn, opaque), orelse=rewrite(s.orelse, fn, opaque))
    elif isinstance(s, ir.WarpSpecialize):
        roles = tuple(rewrite(r, fn, opaque) for r in s.roles)
        s = dataclasses.replace(s, roles=roles)
    r = fn(s)
    return s if r is None else r


def exprs_of(s: ir.Stmt) -> Iterator[ir.Expr]:
    """The expressions a statement reads directly (not those of nested bodies)."""
    def region(r: ir.Region):
        yield from r.starts

    if isinstance(s, ir.Copy):
        yield from region(s.src)
        yield from region(s.dst)
        if s.barrier is not None:
            yield s.barrier.index
    elif isinstance(s, ir.Gemm):
        for r in (s.a, s.b, s.c):
            yield from region(r)
        if s.clear_if is not None:
            yield s.clear_if
    elif isinstance(s, ir.Fill):
        yield from region(s.dst)
        yield s.value
    elif isinstance(s, ir.Store):
        yield from s.indices
        yield s.value
    elif isinstance(s, ir.AtomicAdd):
        yield from region(s.dst)
        if isinstance(s.value, ir.Region):
            yield from region(s.value)
        else:
            yield s.value
    elif isinstance(s, ir.For):
        yield from (s.start, s.stop, s.step)
    elif isinstance(s, ir.If):
        yield s.cond
    elif isinstance(s, ir.BarrierArrive):
        yield s.barrier.index
    elif isinstance(s, ir.BarrierWait):
        yield s.barrier.index
        yield s.parity
    elif isinstance(s, ir.PointerView):
        yield s.address
        yield from s.strides


def subexprs(e: ir.Expr) -> Iterator[ir.Expr]:
    """``e`` and every expression inside it (pre-order)."""
    yield e
    if isinstance(e, ir.BinOp) or isinstance(e, ir.Cmp):
        yield from subexprs(e.a)
        yield from subexprs(e.b)
    elif isinstance(e, ir.UnOp):
        yield from subexprs(e.a)
    elif isinstance(e, ir.Call):
        for a in e.args:
            yield from subexprs(a)
    elif isinstance(e, (ir.Cast, ir.Bitcast)):
        yield from subexprs(e.value)
    elif isinstance(e, ir.Select):
        for a in (e.cond, e.a, e.b):
            yield from subexprs(a)
    elif isinstance(e, ir.Load):
        for a in e.indices:
            yield from subexprs(a)


def element_accesses(s: ir.Stmt) -> list[tuple[ir.Buffer, tuple[ir.Expr, ...]]]:
    """(buffer, indices) of each element a statement (not its nested bodies) stores or loads:
    a ``Store``'s target first, then the loads in its expressions."""
    out = [(s.buffer, s.indices)] if isinstance(s, ir.Store) else []
    return out + [(x.buffer, x.indices) for e in exprs_of(s) for x in subexprs(e)
                  if isinstance(x, ir.Load)]


def buffers_read(s: ir.Stmt) -> list[ir.Buffer]:
    """Buffers a statement (not its nested bodies) reads, in order."""
    out: list[ir.Buffer] = []
    if isinstance(s, ir.Copy):
        out.append(s.src.buffer)
    elif isinstance(s, ir.Gemm):
        out += [s.a.buffer, s.b.buffer]
        if not s.clear_accum:
            out.append(s.c.buffer)
    elif isinstance(s, ir.Reduce):
        out.append(s.src)
        if not s.clear:
            out.append(s.dst)
    elif isinstance(s, ir.CumSum):
        out.append(s.src)
    elif isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region):
        out.append(s.value.buffer)
    for e in exprs_of(s):
        out += [x.buffer for x in subexprs(e) if isinstance(x, ir.Load)]
    return out


def buffers_written(s: ir.Stmt) -> list[ir.Buffer]:
    """Buffers a statement (not its nested bodies) writes."""
    if isinstance(s, ir.Copy):
        return [s.dst.buffer]
    if isinstance(s, ir.Gemm):
        return [s.c.buffer]
    if isinstance(s, ir.Fill):
        return [s.dst.buffer]
    if isinstance(s, ir.AtomicAdd):
        return [s.dst.buffer] + ([s.prev] if s.prev is not None else [])
    if isinstance(s, (ir.Reduce, ir.CumSum)):
        return [s.dst]
    if isinstance(s, ir.Store):
        return [s.buffer]
    return []


def footprint(*stmts: ir.Stmt) -> tuple[set, set]:
    """(buffers read, buffers written) by ``stmts`` and every statement nested in them."""
    reads: set = set()
    writes: set = set()
    for s in stmts:
        for t in walk(s):
            reads.update(buffers_read(t))
            writes.update(buffers_written(t))
    return reads, writes


def touched(*stmts: ir.Stmt) -> set:
    """Buffers ``stmts`` (nested statements included) read or write."""
    reads, writes = footprint(*stmts)
    return reads | writes


def users(body: ir.Stmt, buffer: ir.Buffer) -> list[ir.Stmt]:
    """The statements of ``body`` that read or write ``buffer``, in order, leaving out the loops,
    branches and lists around them."""
    return [s for s in walk(body) if not isinstance(s, (ir.For, ir.If, ir.Seq)) and buffer in touched(s)]


def transform(node, fn: Callable):
    """Rebuild any IR node bottom-up: its IR-valued fields first (nested tuples included), then
    ``fn(node)``, which returns a replacement or None to keep the node. Buffers are leaves (``fn``
    sees them); locations are kept."""
    if isinstance(node, tuple):
        out = tuple(transform(x, fn) for x in node)
        return node if all(a is b for a, b in zip(out, node)) else out
    if isinstance(node, ir.Buffer):
        r = fn(node)
        return node if r is None else r
    if not dataclasses.is_dataclass(node) or isinstance(node, ir.Loc):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        nv = transform(v, fn)
        if nv is not v:
            changes[f.name] = nv
    if changes:
        node = dataclasses.replace(node, **changes)
    r = fn(node)
    return node if r is None else r


def generic_shared_writes(s: ir.Stmt) -> set:
    """Shared buffers ``s`` writes through the generic proxy (ordinary stores; a ``Parallel``'s
    element stores, per-thread code's included)."""
    if isinstance(s, ir.Parallel):
        return {b for t in walk(s.body) for b in generic_shared_writes(t)}
    if isinstance(s, ir.Copy) and s.mechanism is ir.CopyMechanism.TMA:
        return set()
    if isinstance(s, (ir.Copy, ir.Fill)):
        return {s.dst.buffer} if s.dst.buffer.scope is ir.Scope.SHARED else set()
    if isinstance(s, ir.Store):
        return {s.buffer} if s.buffer.scope is ir.Scope.SHARED else set()
    return set()


def bulk_reduce(s: ir.Stmt) -> bool:
    """Whether ``s`` adds a shared tile into global memory (a tile ``T.atomic_add``; on Hopper a
    bulk reduce-add, which reads the tile through the asynchronous proxy as a bulk store does)."""
    return isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region) \
        and s.value.buffer.scope is ir.Scope.SHARED and s.dst.buffer.scope is ir.Scope.GLOBAL


def bulk_tiles(s: ir.Stmt):
    """(global tile, shared tile) of a bulk (TMA) copy or of a bulk reduce-add, else None."""
    if isinstance(s, ir.Copy) and s.mechanism is ir.CopyMechanism.TMA:
        return (s.src, s.dst) if s.src.buffer.scope is ir.Scope.GLOBAL else (s.dst, s.src)
    if bulk_reduce(s):
        return s.dst, s.value
    return None


def bulk_store_tile(s: ir.Stmt) -> Optional[ir.Region]:
    """The shared tile a bulk (TMA) store, or a bulk reduce-add, into global memory reads; else
    None."""
    if isinstance(s, ir.Copy) and s.mechanism is ir.CopyMechanism.TMA and s.dst.buffer.scope is ir.Scope.GLOBAL:
        return s.src
    return s.value if bulk_reduce(s) else None


def async_shared_reads(s: ir.Stmt) -> set:
    """Shared buffers ``s`` reads through the asynchronous proxy (bulk stores and bulk reduce-adds,
    wgmma operands)."""
    tile = bulk_store_tile(s)
    if tile is not None:
        return {tile.buffer}
    if isinstance(s, ir.Gemm) and s.instr is ir.GemmInstr.WGMMA:
        return {s.a.buffer, s.b.buffer}
    return set()


def fresh_name(kernel: ir.Kernel, name: str, taken: frozenset = frozenset()) -> str:
    """``name``, or ``name_<n>`` if a variable or buffer of the kernel already has it, or a name of
    ``taken`` (those a rewrite has made and not yet put into the kernel)."""
    used = {v.name for v in kernel.block_vars} | {p.name for p in kernel.params} | set(taken)
    named = (ir.Var, ir.Buffer)
    transform(kernel.body, lambda n: used.add(n.name) if isinstance(n, named) else None)
    fresh, n = name, 0
    while fresh in used:
        n += 1
        fresh = f"{name}_{n}"
    return fresh
