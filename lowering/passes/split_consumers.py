"""split_consumers: give each warp group of an automatic consumer its own rows, as its own role.

A consumer of several warp groups run as one role is one Gluon partition: every barrier arrival
synchronizes its warp groups, so they issue their gemms and run their softmax in lockstep and
the tensor cores idle while all do fragment math. As one role per warp group, each with its share
of the tile's rows, they only meet at the producer's barriers, and drift apart by a gemm: one
warp group's softmax runs under another's gemms (the ping-pong FlashAttention-3 arranges with
named barriers). Three warp groups of 64 rows (a 192-row tile) also make the only consumer of
three that Gluon can run: a partition's warps are a power of two.

Requires:  warp_specialize has run; in the pipelines of backends with warp-group
           MMA (gluon), under ``config.policy.split_consumers``,
           to kernels with a ``PipelinePlan`` (the automatic schedule), persistent ones included.
Ensures:   when the consumer role ``ws(1, ..., n)`` (n >= 2 warp groups) does fragment math (a
           ``T.Parallel`` or a reduction) inside its innermost loop (not only in a persistent
           tile's epilogue), keeps all its fragments with BM rows in dim 0 (BM a multiple of
           64 n), reads shared
           tiles of BM rows (dim 0; dim 1 of a ring buffer, whose dim 0 is the slot) only as the
           A operand of its gemms or, a tile's, inside a ``T.Parallel`` whose first variable
           indexes its rows (a staged tile stored by element: the varlen forward's last block),
           and shared vectors of BM rows (their last dim) only whole (or a
           ring slot whole) into 1-d fragments (block-wise FP8's row scales)
           (and writes / stores such buffers only whole, through fragment -> shared copies and
           shared -> global copies; other roles may only fill them from global memory), indexes every fragment inside a ``T.Parallel`` with the
           loop's first variable in dim 0 — it becomes roles ``ws(1)``, ..., ``ws(n)``: role h
           (from 0) has fragments ``<name>_h`` of R = BM / n rows, reads and writes rows
           [h R, (h + 1) R) of those shared buffers and of the global tile they (or its fragments,
           stored from registers) are stored to,
           and its parallel loops run over R rows with the row index shifted by h R outside fragment
           accesses (masks read the true row); each role has its own copy of the consumer's
           local buffers (a guarded loop's iteration counter). Where BM is no power of two
           (Triton allocates no such tile), each of those shared buffers becomes one tile of R
           rows per role, ``<name>_h``, which role h uses whole, and another role's copy from
           global memory into the buffer becomes one copy per part, in row order, on the same
           barrier; so does a shared tile of BM rows (dim 0) that a block-level ``T.atomic_add``
           adds whole into global memory (a bulk reduce-add takes a whole tile: the attention
           backward's split-tail dK / dV), role h adding its tile into its R rows of the global
           tile. A ``ConsumerSplit`` plan names the roles. A consumer with any other
           block-level atomic (one add per block) stays one role, except under
           ``config.policy.split_partials``: a gemm summing over the rows (``transpose_a``, A a
           row-split shared tile, B's rows the row-split rows of a shared tile, its accumulator
           C cleared by it and of other than BM rows) becomes one partial product per role over
           its own rows (role h's ``C_h``, C's whole shape), which may only be copied whole
           into a shared staging tile that only block-level atomic adds into global read (role
           h's own copy ``<staging>_h``, whole): each role adds its partial, so the sum is
           added as before (twice the atomic traffic for two roles); and a 1-d fragment of
           other than BM elements, filled only whole from a shared vector and read only
           inside ``T.Parallel`` (a row vector over the tile's columns: attention backward's
           LSE / Delta), is each role's own whole copy read from the whole vector. Barrier
           arrivals are counted in threads, so the roles together arrive as the one did.
           Under ``config.policy.take_turns`` (two roles), where those whole partials beside a
           role's other accumulators would take more than ``ACCUMULATOR_REGS`` registers a
           thread but the accumulators kept across iterations plus the larger of those cleared
           each iteration and the partials take at most ``TURN_ACCUMULATOR_REGS``, the consumer
           is split all the same and the plan says ``turns`` (take_turns then has the roles
           compute the product over all rows in turns).
           Anything else is unchanged, with a note.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..plans import ConsumerSplit, PipelinePlan
from ..config import BackendConfig
from ..traverse import buffers_read, buffers_written, element_accesses, touched, transform, walk


# split_partials: a role's gemm accumulators, its partials whole, in at most this many registers
# per thread (a worker role holding gemms has 232: the rest for operands, addresses and fragment
# math); attention's backward takes 160 at D64, 256 at D128 (which would spill)
ACCUMULATOR_REGS = 168
# take_turns (two roles): the accumulators kept across iterations, and the larger of those each
# iteration clears and the whole product computed in turns, in at most this many (the roles
# then ask for 240: the D128 backward's 128 + max(64, 64) compile without spills in the loop)
TURN_ACCUMULATOR_REGS = 192


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    plan = kernel.find_plan(PipelinePlan)
    if not config.policy.split_consumers or plan is None:
        return kernel
    wss = [s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)]
    consumer = next((r for ws in wss for r in ws.roles
                     if len(r.warpgroups) > 1 and r.warpgroups == tuple(range(1, len(r.warpgroups) + 1))), None)
    if consumer is None:
        return kernel
    parts = len(consumer.warpgroups)
    partials = config.policy.split_partials
    turns = partials and config.policy.take_turns and parts == 2
    rows, why = _rows(kernel, consumer, parts, partials, turns)
    if rows is None:
        return kernel.with_note(f"split_consumers: the consumer keeps its {parts} warp groups in one "
                                f"role: {why}")
    # registers: fragments (split by rows) and locals (a guarded loop's iteration counter: each
    # role keeps its own copy)
    used = touched(consumer.body)
    owned = [s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)       # in allocation
             and s.buffer.scope in (ir.Scope.FRAGMENT, ir.Scope.LOCAL) and s.buffer in used]  # order
    shared = _row_shared(consumer, rows)
    whole = _whole(consumer, rows) if partials else set()       # each role's own, whole
    # a shared tile of rows no power of two (Triton allocates none), or one a block-level atomic
    # adds (a bulk reduce-add takes a whole tile), becomes one tile per role
    added = _added(consumer, shared, rows)
    own = [s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc) and s.buffer in shared
           and (not ir.is_power_of_two(rows) or s.buffer in added)]
    staging = [s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc) and s.buffer in whole
               and s.buffer.scope is ir.Scope.SHARED]
    split, allocs, parts_of = [], [], {b: [] for b in own}
    share = rows // parts
    for h in range(parts):
        renamed = {b: _rows_renamed(b, h, share if b not in whole else None,
                                    shared[b] if b.scope is ir.Scope.SHARED and b in shared else 0)
                   for b in owned + own + staging}
        allocs += [ir.Alloc(b, b.loc) for b in renamed.values()]
        for b in own:
            parts_of[b].append((renamed[b], shared[b]))
        body = _part(consumer.body, h * share, share, renamed, shared,
                     whole | {renamed[b] for b in whole if b in renamed})
        split.append(dataclasses.replace(consumer, warpgroups=(h + 1,), body=body))
    top = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.Alloc) and (s.buffer in owned or s.buffer in own or s.buffer in staging):
            continue
        if isinstance(s, ir.WarpSpecialize):
            roles = tuple(r for c in s.roles for r in (
                split if c is consumer else [dataclasses.replace(c, body=_fill_parts(c.body, parts_of))]))
            s = dataclasses.replace(s, roles=roles)
        top.append(s)
    allocs_end = max(k for k, s in enumerate(top) if isinstance(s, ir.Alloc)) + 1
    body = ir.Seq(tuple(top[:allocs_end] + allocs + top[allocs_end:]), kernel.body.loc)
    names = [f"ws({h + 1})" for h in range(parts)]
    sums = sorted(b.name for b in whole if b.scope is ir.Scope.FRAGMENT and len(b.shape) > 1)
    turns = turns and _registers(consumer, rows, parts, _row_shared(consumer, rows))[0] > ACCUMULATOR_REGS
    return dataclasses.replace(kernel, body=body).with_plan(
        ConsumerSplit(tuple(r.warpgroups for r in split), turns)).with_note(
        f"split_consumers: the consumer's {rows} rows are split between roles "
        f"{', '.join(names[:-1])} and {names[-1]}, {share} each, so one warp group's fragment math "
        f"runs under another's gemms" + (f"; each adds its own partial {', '.join(sums)} over its "
                                         f"rows" if sums else ""))


def _rows_renamed(b: ir.Buffer, h: int, rows: Optional[int], dim: int) -> ir.Buffer:
    """Role h's own copy of ``b``: ``<name>_h``, ``rows`` rows in ``dim`` (scalar locals, and
    with ``rows`` None a whole copy, keep their shape)."""
    shape = b.shape
    if b.scope is not ir.Scope.LOCAL and rows is not None:
        shape = shape[:dim] + (ir.Const(rows, ir.DType.I32, b.loc),) + shape[dim + 1:]
    return dataclasses.replace(b, name=f"{b.name}_{h}", shape=shape)


def _fill_parts(body: ir.Seq, parts_of: dict) -> ir.Seq:
    """Another role's body with each global -> shared copy filling a split tile made one copy
    per part, of that part's rows, in row order (on the same barrier: the arrival expecting it
    counts the same bytes)."""
    def fn(n):
        if not isinstance(n, ir.Seq):
            return None
        out = []
        for s in n.stmts:
            parts = parts_of.get(s.dst.buffer) if isinstance(s, ir.Copy) else None
            for h, (p, d) in enumerate(parts or ()):
                rows = p.static_shape[d]
                dst = dataclasses.replace(s.dst, buffer=p, extents=s.dst.extents[:d] + (rows,) + s.dst.extents[d + 1:])
                out.append(_global_rows(dataclasses.replace(s, dst=dst), h * rows, rows))
            if not parts:
                out.append(s)
        return dataclasses.replace(n, stmts=tuple(out))
    return transform(body, fn) if parts_of else body


def _global_rows(s, offset: int, rows: int):
    """``s`` (a copy, or a tile ``atomic_add`` into global memory) with its global region cut to
    ``rows`` rows from ``offset`` (the region's first dim of more than one element: the tile's
    rows)."""
    g = s.dst if s.dst.buffer.scope is ir.Scope.GLOBAL else s.src
    d = next(k for k, e in enumerate(g.extents) if e != 1)
    start = ir.BinOp(ir.BinOpKind.ADD, g.starts[d], ir.Const(offset, ir.DType.I32, s.loc), ir.DType.I32, s.loc)
    g2 = dataclasses.replace(g, starts=g.starts[:d] + (start,) + g.starts[d + 1:],
                             extents=g.extents[:d] + (rows,) + g.extents[d + 1:])
    return dataclasses.replace(s, dst=g2) if g is s.dst else dataclasses.replace(s, src=g2)


def _added(role: ir.Role, shared: dict, rows: int) -> set:
    """The row-split shared tiles (``rows`` rows in dim 0) the role adds whole into global memory
    by block-level atomics (each role then adds its own rows)."""
    return {s.value.buffer for s in walk(role.body, opaque=(ir.Parallel,))
            if isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region)
            and s.value.buffer in shared and s.value.is_whole and shared[s.value.buffer] == 0
            and ir.as_int(s.value.buffer.shape[0]) == rows and s.dst.buffer.scope is ir.Scope.GLOBAL}


def _row_shared(role: ir.Role, rows: Optional[int] = None) -> dict[ir.Buffer, int]:
    """Shared buffers the role reads as gemm A operands or writes from fragments of ``rows``
    rows (rows: dim 0 of a tile or of a vector, dim 1 of a ring of them, whose dim 0 is the
    slot), and shared vectors it reads into 1-d fragments of ``rows`` elements (rows: the last
    dim), each with the dim of its rows (``rows`` None: fragments of any size)."""
    out = {}
    ours = lambda b: rows is None or ir.as_int(b.shape[0]) == rows  # noqa: E731
    for s in walk(role.body):
        if isinstance(s, ir.Gemm) and s.a.buffer.scope is ir.Scope.SHARED:
            out[s.a.buffer] = len(s.a.buffer.shape) - 2
        if isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.FRAGMENT \
                and s.dst.buffer.scope is ir.Scope.SHARED and ours(s.src.buffer):  # a tile, or lse
            out[s.dst.buffer] = len(s.dst.buffer.shape) - len(s.src.buffer.shape)
        if isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.SHARED \
                and s.dst.buffer.scope is ir.Scope.FRAGMENT and len(s.dst.buffer.shape) == 1 \
                and ours(s.dst.buffer):
            out[s.src.buffer] = len(s.src.buffer.shape) - 1
    return out


def _row_sum(s: ir.Stmt, shared: dict, rows: int) -> bool:
    """Whether ``s`` is a gemm summing over the row-split rows: ``C = A^T B`` with A's rows
    and B's rows (each's dim -2) the row-split rows of shared tiles, C cleared by it and not of
    ``rows`` rows (a whole partial per role)."""
    return (isinstance(s, ir.Gemm) and s.transpose_a and not s.transpose_b and s.clear_accum
            and ir.as_int(s.c.buffer.shape[0]) != rows
            and s.a.buffer in shared and s.b.buffer in shared
            and shared[s.a.buffer] == len(s.a.buffer.shape) - 2
            and shared[s.b.buffer] == len(s.b.buffer.shape) - 2)


def _whole(role: ir.Role, rows: int) -> set:
    """The buffers each role keeps whole under ``split_partials`` (``_rows`` has checked their
    uses): fragments of other than ``rows`` rows in dim 0 (row-sum partials, row vectors over
    the columns) and the shared staging tiles the partials are copied into."""
    frags = {b for s in walk(role.body) for b in buffers_read(s) + buffers_written(s)
             if b.scope is ir.Scope.FRAGMENT and ir.as_int(b.shape[0]) != rows}
    frags |= {b for s in walk(role.body) if isinstance(s, ir.Parallel) for t in walk(s.body)
              for b, _ in element_accesses(t) if b.scope is ir.Scope.FRAGMENT
              and ir.as_int(b.shape[0]) != rows}
    return frags | {s.dst.buffer for s in walk(role.body) if isinstance(s, ir.Copy)
                    and s.src.buffer in frags and s.dst.buffer.scope is ir.Scope.SHARED}


def _registers(role: ir.Role, rows: int, parts: int, shared: dict) -> tuple[int, int]:
    """Registers per thread of each role's gemm accumulators with its row-sum partials whole:
    all at once (split_partials), and in turns (take_turns: those kept across iterations, plus
    the larger of those cleared each iteration and the partials, which are live after them)."""
    whole = _whole(role, rows)
    gemms = [s for s in walk(role.body) if isinstance(s, ir.Gemm)]
    sums = {s.c.buffer for s in gemms if _row_sum(s, shared, rows)}
    cleared = {s.c.buffer for s in gemms if s.clear_accum} - sums
    regs = {b: ir.as_int(b.shape[0]) // (1 if b in whole else parts) * ir.as_int(b.shape[1]) // 128
            for b in {s.c.buffer for s in gemms}}
    kept = sum(n for b, n in regs.items() if b not in cleared and b not in sums)
    return sum(regs.values()), kept + max(sum(regs[b] for b in cleared), sum(regs[b] for b in sums))


def _partials_refused(role: ir.Role, rows: int, parts: int, shared: dict, turns: bool) -> Optional[str]:
    """Why the role's fragments of other than ``rows`` rows cannot each be the roles' own
    whole copies (``_whole``), or None (``turns``: where all at once would not fit the
    registers, the roles may compute the row sums in turns)."""
    whole = _whole(role, rows)
    sums = {s.c.buffer for s in walk(role.body) if _row_sum(s, shared, rows)}
    regs, in_turns = _registers(role, rows, parts, shared)
    if sums and regs > ACCUMULATOR_REGS and not (turns and in_turns <= TURN_ACCUMULATOR_REGS):
        return (f"each role's gemm accumulators, its partial {sorted(b.name for b in sums)[0]} "
                f"whole, would take {regs} registers per thread (at most {ACCUMULATOR_REGS}"
                + (f"; {in_turns} in turns, at most {TURN_ACCUMULATOR_REGS}" if turns else "") + ")")
    for s in walk(role.body, opaque=(ir.Parallel,)):
        mine = {b for t in walk(s.body) for b, _ in element_accesses(t)} if isinstance(s, ir.Parallel) \
            else set(buffers_read(s) + buffers_written(s))
        mine &= whole
        if not mine:
            continue
        if _row_sum(s, shared, rows):
            continue
        if isinstance(s, ir.Copy) and s.src.buffer in sums and s.dst.buffer in whole \
                and s.src.is_whole and s.dst.is_whole:
            continue            # a partial staged whole
        if isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region) and s.value.buffer in whole \
                and s.value.buffer.scope is ir.Scope.SHARED and s.dst.buffer.scope is ir.Scope.GLOBAL:
            continue            # a staged partial added
        if isinstance(s, ir.Copy) and s.dst.buffer in whole and s.dst.buffer not in sums \
                and len(s.dst.buffer.shape) == 1 and s.src.buffer.scope is ir.Scope.SHARED \
                and s.dst.is_whole:
            continue            # a row vector over the columns, read whole
        if isinstance(s, ir.Parallel) and not (mine & sums) and not any(
                b in whole for t in walk(s.body) for b in buffers_written(t)):
            continue            # read in fragment math
        return (f"line {s.loc.line} uses '{sorted(b.name for b in mine)[0]}', which has no "
                f"{rows} rows, other than as a row-sum partial or a row vector")
    return None


def _rows(kernel: ir.Kernel, role: ir.Role, parts: int, partials: bool,
          turns: bool = False) -> tuple[Optional[int], str]:
    """BM, or None and why the role cannot be split in ``parts`` (``partials``: row-sum gemms
    and row vectors over the columns allowed, ``split_partials``; ``turns``: computed in turns
    where they do not fit the registers at once, ``take_turns``)."""
    gemms = [s for s in walk(role.body) if isinstance(s, ir.Gemm)]
    if not gemms:
        return None, "it computes no gemm"
    inner = [s for s in walk(role.body) if isinstance(s, ir.For)
             and not any(isinstance(t, ir.For) for t in walk(s.body))]      # not a tile loop
    if not any(isinstance(t, (ir.Parallel, ir.Reduce)) for lp in inner for t in walk(lp.body)):
        return None, "its loop does no fragment math to overlap (a plain GEMM keeps one merged role)"
    rows = gemms[0].c.tile_shape[0]
    if rows % (64 * parts):
        return None, f"its {rows}-row tile does not split into {parts} parts of a multiple of 64 rows"
    shared = _row_shared(role, rows if partials else None)
    whole = set()
    if partials:
        why = _partials_refused(role, rows, parts, shared, turns)
        if why:
            return None, why
        whole = _whole(role, rows)
    added = _added(role, shared, rows)
    for s in walk(role.body, opaque=(ir.Parallel,)):
        if isinstance(s, ir.AtomicAdd) and not (isinstance(s.value, ir.Region)
                                                and (s.value.buffer in whole or s.value.buffer in added)):
            return None, f"the atomic at line {s.loc.line} is one per block; {parts} roles would each add"
    for s in walk(role.body):
        if isinstance(s, ir.Gemm) and not (partials and _row_sum(s, shared, rows)):
            if s.transpose_a or s.b.buffer in shared:
                return None, f"the gemm at line {s.loc.line} reads a row-split buffer as B or transposed"
        for b in buffers_read(s) + buffers_written(s):
            if b in whole:
                continue
            if b.scope is ir.Scope.FRAGMENT and ir.as_int(b.shape[0]) != rows:
                return None, f"fragment '{b.name}' does not have {rows} rows in dim 0"
            if b in shared and ir.as_int(b.shape[shared[b]]) != rows:
                return None, f"shared buffer '{b.name}' does not have {rows} rows"
        if isinstance(s, ir.Copy) and (s.src.buffer in shared or s.dst.buffer in shared):
            r = s.src if s.src.buffer in shared else s.dst
            if not _all_rows(r, shared[r.buffer]):
                return None, f"the copy at line {s.loc.line} uses part of '{r.buffer.name}'"
            other = s.dst if r is s.src else s.src
            if other.buffer.scope not in (ir.Scope.FRAGMENT, ir.Scope.GLOBAL):
                return None, f"the copy at line {s.loc.line} moves '{r.buffer.name}' within shared memory"
        if isinstance(s, ir.Parallel):
            for t in walk(s.body):
                for b, idx in element_accesses(t):
                    if b.scope is ir.Scope.FRAGMENT and b not in whole and (not idx or idx[0] != s.vars[0]):
                        return None, (f"the T.Parallel at line {s.loc.line} indexes a fragment's "
                                      f"rows with something other than its first variable")
                    if b in shared and (shared[b] or idx[0] != s.vars[0]):
                        return None, (f"the T.Parallel at line {s.loc.line} indexes the rows of "
                                      f"'{b.name}' with something other than its first variable")
    for ws in (s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)):
        for r in (r for r in ws.roles if r is not role):
            for s in walk(r.body):
                used = set(buffers_read(s) + buffers_written(s)) & shared.keys()
                loads = isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.GLOBAL
                if used and not loads:     # the producer may fill them whole (Q); nothing else
                    return None, f"line {s.loc.line} of another role uses '{used.pop().name}'"
    return rows, ""


def _all_rows(r: ir.Region, dim: int) -> bool:
    """Whether ``r`` is its buffer whole, or one ring slot of it whole (a start in dim 0, the
    slot, and all of the other dims, rows ``dim`` included)."""
    return r.is_whole or (dim > 0 and all(ir.as_int(st) == 0 for st in r.starts[1:])
                          and r.extents[1:] == r.buffer.static_shape[1:])


def _part(body: ir.Seq, offset: int, size: int, renamed: dict, shared: dict, whole: set) -> ir.Seq:
    """The role's body restricted to rows [offset, offset + size): of its fragments and of the
    row-split shared buffers ``shared`` (each with the dim of its rows), or all rows of its own
    copies (``renamed``) of them; the buffers of ``whole`` (and their copies) stay whole."""
    c = lambda v, loc: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    mine = {v: shared[b] for b, v in renamed.items() if b in shared}
    row_dims = {**shared, **mine}          # every row-split buffer (shared or a role's own)

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
        if isinstance(n, ir.Region) and n.buffer.scope is ir.Scope.FRAGMENT and n.buffer not in whole:
            return dataclasses.replace(n, extents=(size,) + tuple(n.extents[1:]))
        if isinstance(n, ir.Region) and n.buffer in row_dims:
            d, first = row_dims[n.buffer], 0 if n.buffer in mine else offset
            return dataclasses.replace(n, starts=n.starts[:d] + (c(first, n.loc),) + n.starts[d + 1:],
                                       extents=n.extents[:d] + (size,) + n.extents[d + 1:])
        if isinstance(n, ir.Copy) and n.src.buffer not in whole and n.dst.buffer.scope is ir.Scope.GLOBAL \
                and (n.src.buffer in row_dims or n.src.buffer.scope is ir.Scope.FRAGMENT):  # stored tile
            return _global_rows(n, offset, size)
        if isinstance(n, ir.AtomicAdd) and isinstance(n.value, ir.Region) and n.value.buffer in mine:
            return _global_rows(n, offset, size)          # a row-split tile added
        return None
    return transform(body, fn)
