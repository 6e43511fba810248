"""registerize: shared buffers one role keeps to itself and reads only as whole tiles, vectors
and element math become fragments (register tiles); a fragment's block copied into such a tile
only to be stored to global memory is stored directly.

Warp-specialized code holds shared memory for what several roles exchange or asynchronous
operations read (TMA, wgmma); a buffer the program declares shared but uses as scratch of one
role (GQA decode's per-block score column ``S_shared[:, k]``, its sink vector, its output staging
``O_shared``) needs neither, and the Gluon emitter spells fragment math on register tiles only.

Requires:  warp_specialize has run; in the pipelines of backends with warp-group MMA (gluon).
Ensures:   in a kernel with one ``WarpSpecialize``: first, in each statement list,
           ``copy F[block] -> X; ...; copy X -> G`` where X is a shared buffer touched by nothing
           else, F a fragment not written between the two, ``block`` not all of F, X whole in
           both and of G's dtype becomes ``copy F[block] -> G`` at the second copy's place (X's
           allocation goes: a block of register rows is stored from registers under a mask);
           then a shared buffer of rank 1 or 2 allocated at the kernel's top level becomes a
           fragment of the same name, shape and dtype when one role alone touches it and every
           statement touching it is
           * a copy without a barrier whose other side is global memory, a fragment or such a
             buffer, except a copy of all of it to global memory (a bulk store, which reads
             shared memory),
           * a fill, or
           * a ``T.Parallel`` reading and writing it at the loop's variables in order over its
             whole extent, or reading it as a vector indexed by one of them over its extent.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..config import BackendConfig
from ..traverse import buffers_written, element_accesses, subexprs, touched, transform, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    wss = [s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)]
    if len(wss) != 1:
        return kernel
    body, dropped = _forward_blocks(kernel.body)
    body = dataclasses.replace(body, stmts=tuple(
        s for s in body.stmts if not (isinstance(s, ir.Alloc) and s.buffer in dropped)))
    kernel = dataclasses.replace(kernel, body=body)
    chosen = _private_scratch(kernel, next(s for s in body.stmts if isinstance(s, ir.WarpSpecialize)))
    if not chosen and not dropped:
        return kernel
    as_fragment = {b: dataclasses.replace(b, scope=ir.Scope.FRAGMENT) for b in chosen}
    body = transform(kernel.body, lambda n: as_fragment.get(n) if isinstance(n, ir.Buffer) else None)
    names = ", ".join(sorted(b.name for b in chosen)) or "nothing"
    gone = "".join(f"; {b.name}'s copies forwarded to global memory" for b in sorted(dropped, key=lambda b: b.name))
    return dataclasses.replace(kernel, body=body).with_note(
        f"registerize: {names} held in registers (one role's scratch, no asynchronous use){gone}")


def _private_scratch(kernel: ir.Kernel, ws: ir.WarpSpecialize) -> set:
    """The shared buffers the module docstring lets become fragments."""
    allocated = {s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)
                 and s.buffer.scope is ir.Scope.SHARED and len(s.buffer.shape) in (1, 2)}
    users: dict = {}
    for r in ws.roles:
        for s in walk(r.body, opaque=(ir.Parallel,)):
            used = _bound_reads(s) if isinstance(s, (ir.For, ir.If)) else touched(s)
            for b in used & allocated:
                users.setdefault(b, []).append((r, s))
    chosen = {b for b, uses in users.items() if len({id(r) for r, _ in uses}) == 1
              and all(_register_use(s, b) for _, s in uses)}
    while True:                     # copy partners must be global, fragments or chosen buffers
        bad = {b for b in chosen for _, s in users[b] if isinstance(s, ir.Copy)
               and any(o.buffer.scope is ir.Scope.SHARED and o.buffer not in chosen
                       for o in (s.src, s.dst))}
        if not bad:
            return chosen
        chosen -= bad


def _bound_reads(s) -> set:
    """Buffers a loop's bounds or a branch's condition read."""
    heads = (s.cond,) if isinstance(s, ir.If) else (s.start, s.stop, s.step)
    return {x.buffer for e in heads for x in subexprs(e) if isinstance(x, ir.Load)}


def _register_use(s: ir.Stmt, b: ir.Buffer) -> bool:
    if isinstance(s, (ir.For, ir.If)):
        return False
    if isinstance(s, ir.Copy):      # a whole tile stored to global memory stays a bulk store
        whole_store = s.src.buffer == b and s.src.is_whole and s.dst.buffer.scope is ir.Scope.GLOBAL
        return s.barrier is None and s.src.buffer != s.dst.buffer and not whole_store
    if isinstance(s, ir.Fill):
        return True
    if not isinstance(s, ir.Parallel):
        return False
    shape = b.static_shape
    for t in walk(s.body):
        for buf, idx in element_accesses(t):
            if buf != b:
                continue
            whole = tuple(idx) == s.vars and shape == tuple(s.extents)
            vector = (len(idx) == 1 and idx[0] in s.vars
                      and shape[0] == s.extents[s.vars.index(idx[0])])
            if not (whole or vector and b not in buffers_written(t)):
                return False
    return True


def _forward_blocks(body: ir.Seq) -> tuple[ir.Seq, set]:
    """Forward copies of a fragment's block through a shared buffer to global memory (module
    docstring); the buffers that became unused."""
    dropped: set = set()

    def fn(s):
        if not isinstance(s, ir.Seq):
            return None
        stmts = list(s.stmts)
        for i, first in enumerate(stmts):
            if not (isinstance(first, ir.Copy) and first.dst.buffer.scope is ir.Scope.SHARED
                    and first.src.buffer.scope is ir.Scope.FRAGMENT and not first.src.is_whole
                    and first.dst.is_whole):
                continue
            x = first.dst.buffer
            users = [k for k, t in enumerate(stmts) if x in touched(t)]
            if len(users) != 2 or users[0] != i:
                continue
            second = stmts[users[1]]
            if not (isinstance(second, ir.Copy) and second.src.buffer == x and second.src.is_whole
                    and second.dst.buffer.scope is ir.Scope.GLOBAL
                    and second.dst.buffer.dtype == x.dtype) \
                    or any(first.src.buffer in buffers_written(t) for t in stmts[i + 1:users[1]]):
                continue
            stmts[users[1]] = dataclasses.replace(second, src=first.src)
            del stmts[i]
            dropped.add(x)
            return dataclasses.replace(s, stmts=tuple(stmts))
        return None

    while True:
        before = len(dropped)
        body = _rewrite_seqs(body, fn)
        if len(dropped) == before:
            return body, {b for b in dropped if not _used(body, b)}


def _rewrite_seqs(body: ir.Seq, fn) -> ir.Seq:
    """``body`` with ``fn`` offered every statement list in it (None keeps the list)."""
    def each(node):
        if isinstance(node, ir.Seq):
            return fn(node)
        return None
    return transform(body, each)


def _used(body: ir.Seq, b: ir.Buffer) -> bool:
    return any(b in touched(s) for s in walk(body) if not isinstance(s, ir.Alloc))
