"""legalize_wgmma: on Hopper, decide whether the Gluon path can run the program, and record every
choice its emitter spells; otherwise say why and leave the program to ``triton.language``.

Requires:  warp_specialize, plan_buffers, infer_layouts and legalize have run; in the pipelines
           of backends with warp-group MMA and TMA (gluon).
Ensures:   an ``AsyncPlan``, or an ``AsyncRefusal`` whose reason names the construct and line (the
           backend then refuses the program and the next backend of its chain compiles it from the
           frontend IR). With an ``AsyncPlan``:
           * global -> shared copies are TMA, a tile with a dim above ``TMA_BOX`` elements as
             one copy per box of that many into its slice of the shared tile (``_boxes``; TMA
             stores likewise); in explicit programs a copy followed (before any
             read of its destination) by an arrival on barrier ``b`` completes *on* ``b``
             (expect-tx), so no arrival happens while its bytes are in flight. With the target's
             ``register_copies`` (tl.enable_lower_ldgstg), a copy TMA cannot take (rows not a
             multiple of 16 bytes) keeps legalize's DIRECT / MASKED instead: its role loads it
             through registers in chunks of rows (``register_loads``), ahead of the TMA copies
             of its group with a proxy fence between (or before the arrival when none is TMA),
             and runs a whole warp group;
           * global -> fragment and fragment -> global copies (a whole 1-d or 2-d fragment, not
             a register A operand, or for stores its leading block: registerize's forwarded
             ``acc_o[:valid, :]``) keep legalize's DIRECT / MASKED choice, their buffer passed
             as a pointer (an unstaged epilogue store: warp_specialize);
           * a shared tile copied into a whole 1-d or 2-d fragment is DIRECT (a load from
             shared memory in the fragment's layout);
           * fragment -> shared stores and fragment -> fragment copies (casts, and a whole
             vector into one row or column of a 2-d fragment at a runtime index: a score column
             ``S[:, k]``) are DIRECT and shared -> global copies TMA stores, each followed by
             ``BulkStoreWait(0)``;
           * gemms whose B is in shared memory and whose A is in shared memory or a whole 2-d
             fragment (register A: attention's P @ V) are WGMMA, each followed by ``GemmWait(0)``
             — a run of consecutive gemms none of which reads another's accumulator (the pieces
             split_extents made of one T.gemm) by one ``GemmWait(0)`` after the last;
             FP8 gemms only with K-major tiles (A untransposed, B [N, K] with ``transpose_B``),
             float32 gemms only with ``precision`` TF32 (wgmma's float32 form; IEEE is refused)
             and, as FP8, K-major tiles;
           * fragment math is kept as written: ``T.Parallel`` loops of rank 1 or 2 whose stores
             (possibly under an ``if``) write fragments indexed by all the loop's variables in
             order, or global elements whose indices use every loop variable, and which read
             fragments indexed that way (or so in every dim but one, whose index is computed:
             a gather along it, ``B_local[i, j // 2]``) or vectors indexed by one loop variable,
             global elements and scalars; row/column reductions of 2-d fragments into 1-d
             fragments; fills of fragments;
           * per-thread code (``Parallel(per_thread=True)``, docs/design.md §2) is fragment math
             like a ``T.Parallel`` (its thread and vector dims the loop's), and may also read and
             write one column of a 2-d per-thread local at a uniform index in a loop over the
             thread dim alone (``gathers.per_thread_column``: a call's unrolled code); its reads,
             and unmasked stores, of shared memory where the loop's iterations touch one aligned
             run of whole rows of the tile (``lowering/chunks.py``: TileLang's per-thread
             dequantization) are recorded in the plan's ``shared_chunks`` (a run is a row slice
             of the tile, one register tensor of the loop's per-thread layout reshaped); a run
             starts at a row known when the kernel is compiled: the loops of per-thread code
             (constant bounds) its start depends on become ``ForKind.UNROLL``, and a start
             depending on anything else is refused, saying so; any other read, store or atomic
             add into shared memory element by element is refused, saying so (Gluon has no
             element address in shared memory);
           * element ``T.atomic_add``s to global memory are kept (outside ``T.Parallel`` one per
             block, possibly returning the old value into a scalar local; inside, one per
             iteration); a tile ``T.atomic_add`` of a whole shared tile (or ring slot) into a
             global tile is a bulk reduce-add (TMA, a box of at most ``TMA_BOX`` a dim), followed
             by ``BulkStoreWait(0)`` and fenced like a bulk store; other tile atomics are refused;
           * a ``ProxyFence`` stands between a role's ordinary stores to shared memory and its
             next asynchronous read of them (TMA store, wgmma operand) — docs/ws-semantics.md #5
             — and before an arrival publishing such stores to a buffer another role reads
             asynchronously and does not write (a register-staged tile);
           * shared tiles (a buffer's last two dims; a ring's slots may be any number) and TMA
             boxes have power-of-two extents (Triton's shared layouts and descriptors; split_extents
             cut what it could, and a refusal repeats its reason for keeping a program whole);
           * no ``PointerView`` (``T.make_tensor``): its memory has no descriptor made at
             launch, and the emitter takes global tensors as parameters only;
           * the kernel body is allocations and the one ``WarpSpecialize``; the only local buffers
             are scalars (shape (1,), i32 or f32, indexed by 0) and each is written by a store
             (or an atomic returning into it) before any read, in the same statement list as the
             read or an enclosing one, so it can be a value of the role (Gluon carries it
             through ``scf.for`` / ``scf.if``; one first written inside a loop or branch lives
             there);
             statements read on-chip memory only through such scalars, and read global memory
             element by element (scalar loads, e.g. block-sparse masks in ``if`` conditions) —
             anything else is a refusal naming it (docs/ws-semantics.md #8: guarded pipelined loops);
           * roles get ``num_warps`` / ``num_regs`` (a worker role's request, ``T.set_max_nreg``,
             where it made one; else a role doing only bulk copies, barrier
             operations and scalar bookkeeping: 1 warp, 24 registers; one loading tiles through
             registers: a warp group, ``REGISTER_LOAD_REGS``; the first role holding gemms is
             the default partition, whose warps must be a power of two, other gemm roles (split
             consumers) an even share of what is left, at most ``GEMM_WORKER_REGS``, and the
             default partition the rest of the register file);
           * the plan's ``default_role``, ``num_warps`` (the default partition's), ``barrier_counts``
             (arrivals per phase translated from threads to arriving roles; a count no set of
             arriving roles matches is a ``CompileError`` at the barrier), ``tma_descriptors``,
             ``scalar_locals`` ((name, non-negative) per scalar local: spelled as a value of its
             role; non-negative when no atomic returns into it and every store writes a
             non-negative constant or a sum / product of such values and scalars, e.g. iteration
             counters) and ``pointer_params`` ((global buffer, warp groups of the roles reading
             it) in parameter order: buffers read by element loads, copied into fragments, stored
             element-wise or added to atomically, passed to the kernel and to those roles as
             pointer + strides).
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .. import ir, protocol, roles
from ..errors import CompileError
from ..layouts import Blocked, NVMMAShared, WgmmaAccumulator, WgmmaOperandA
from ..plans import AsyncPlan, AsyncRefusal, LayoutPlan, PipelinePlan, SharedChunk, slot_shape
from ..capabilities import bulk_copy_tensor, row_bytes
from ..config import BackendConfig
from ..chunks import chunk_start
from ..gathers import gathered_axis, per_thread_column
from ..simplify import shifted
from ..traverse import (async_shared_reads, buffers_read, buffers_written, bulk_reduce, exprs_of,
                        generic_shared_writes, rewrite, subexprs, substmts, walk)
from .split_extents import KEPT_WHOLE

_SPELLED = (ir.Alloc, ir.For, ir.If, ir.BarrierWait, ir.BarrierArrive, ir.Copy, ir.Gemm, ir.Fill,
            ir.ProxyFence, ir.GemmWait, ir.Store, ir.AtomicAdd, ir.Parallel, ir.Reduce)
_SCALAR_DTYPES = (ir.DType.I32, ir.DType.F32)     # the types Gluon gives Python literals
_COUNTING = (ir.BinOpKind.ADD, ir.BinOpKind.MUL)
REGISTER_FILE = 65536
TMA_SHARED_ALIGN = 128      # bytes: where a bulk tensor copy may start writing shared memory
TMA_BOX = 256               # elements a dim of one bulk-copy box (Triton's descriptors) holds at most


class _Refuse(Exception):
    pass


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    try:
        return _legalize(kernel, config)
    except _Refuse as why:
        return kernel.with_plan(AsyncRefusal(str(why)))


def _legalize(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    wss = [s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)]
    if len(wss) != 1:
        raise _Refuse("the program has no warp-specialized form (no T.ws roles and no "
                      "T.Pipelined loop of copies feeding a T.gemm)")
    layout_plan = kernel.plan(LayoutPlan)
    laid_out, frames = dict(layout_plan.layouts), dict(layout_plan.frames)
    pipeline = kernel.find_plan(PipelinePlan)
    chunks: dict[tuple[str, int], SharedChunk] = {}
    around = _loops_around(kernel.body, ())
    unrolled: set[tuple[ir.Var, ir.Loc]] = set()        # (var, loc) of the loops to unroll
    for s in _statements(kernel.body):
        if isinstance(s, ir.PointerView):
            raise _Refuse(f"T.make_tensor (line {s.loc.line}) views memory at an address read in "
                          f"the kernel: no TMA descriptor can be made for it at launch")
        if not isinstance(s, (*_SPELLED, ir.WarpSpecialize, ir.Role)):
            raise _Refuse(f"the Gluon emitter does not spell {type(s).__name__.lower()} yet "
                          f"(line {s.loc.line})")
        if isinstance(s, ir.For) and s.kind is ir.ForKind.PIPELINED:
            raise _Refuse(f"a pipelined loop inside a role (line {s.loc.line})")
        if isinstance(s, ir.Parallel):
            chunked = _check_per_thread(s, frames, pipeline, chunks, around[id(s)], unrolled) \
                if s.per_thread else _row_runs(s, frames, pipeline, chunks)
            _check_parallel(s, laid_out, chunked)
        if isinstance(s, ir.Reduce):
            _check_reduce(s)
        if isinstance(s, ir.AtomicAdd):
            _check_atomic(s)
    ws = wss[0]
    scalars = _scalar_locals(kernel, ws)
    bodies = [_unroll(_seq(r.body, laid_out, config.codegen.register_copies), unrolled)
              for r in ws.roles]
    bulk_filled = {t.dst.buffer for body in bodies for t in walk(body) if isinstance(t, ir.Copy)
                   and t.mechanism is ir.CopyMechanism.TMA and t.dst.buffer.scope is ir.Scope.SHARED}
    for s in kernel.body.stmts:
        if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.SHARED:
            tile = slot_shape(s.buffer, pipeline)
            if not all(ir.is_power_of_two(e) for e in tile):
                kept = [n.removeprefix(KEPT_WHOLE) for n in kernel.notes if n.startswith(KEPT_WHOLE)]
                raise _Refuse(f"shared buffer '{s.buffer.name}' is a {list(tile)} tile; Triton's "
                              f"shared layouts take powers of two (line {s.loc.line})"
                              + "".join(f", and split_extents kept it whole: {why}" for why in kept))
            slot_bytes = math.prod(tile) * s.buffer.dtype.itemsize
            if s.buffer in bulk_filled and slot_bytes % TMA_SHARED_ALIGN \
                    and math.prod(s.buffer.static_shape) > math.prod(tile):
                raise _Refuse(f"shared buffer '{s.buffer.name}' has slots of {slot_bytes} bytes; "
                              f"a bulk (TMA) copy writes shared memory at {TMA_SHARED_ALIGN}-byte "
                              f"aligned addresses, so each slot must be a multiple of that "
                              f"(line {s.loc.line})")
    # buffers a role reads asynchronously without writing them: another role's stores publish
    # them (a role's own staged tile, each split consumer's rows of O, is fenced before its read)
    async_read = {b for body in bodies for t in walk(body) for b in async_shared_reads(t)
                  if not any(b in generic_shared_writes(w) for w in walk(body))}
    new_roles = tuple(dataclasses.replace(r, body=_fence(body, set(), async_read))
                      for r, body in zip(ws.roles, bodies))
    pointers = _pointer_params(kernel, dataclasses.replace(ws, roles=new_roles))
    descriptors: list[tuple[str, tuple[int, ...]]] = []
    for r in new_roles:
        for s in walk(r.body):
            if bulk_reduce(s):
                s = _as_copy(s)
            if isinstance(s, ir.Copy) and s.mechanism is ir.CopyMechanism.TMA:
                _check_tma(s)
                entry = (_global(s).name, s.src.extents if s.src.buffer.scope is ir.Scope.GLOBAL
                         else s.dst.extents)
                if entry not in descriptors:
                    descriptors.append(entry)
    default = _default_role(new_roles)
    new_roles = _budget(new_roles, default)
    decided = next(r.num_regs for r in new_roles if r.warpgroups == default.warpgroups)
    if default.num_regs and default.num_regs != decided:
        kernel = kernel.with_note(
            f"legalize_wgmma: {roles.describe(default.warpgroups)} asked for {default.num_regs} "
            f"registers (T.set_max_nreg); as Triton's default partition it gets what the other "
            f"roles leave, {decided}")
    kernel = dataclasses.replace(kernel, body=ir.Seq(
        tuple(dataclasses.replace(ws, roles=new_roles) if s is ws else s for s in kernel.body.stmts),
        kernel.body.loc))
    counts = _mbarrier_counts(kernel)
    return kernel.with_plan(AsyncPlan(
        default_role=default.warpgroups,
        num_warps=next(r.num_warps for r in new_roles if r.warpgroups == default.warpgroups),
        barrier_counts=counts, tma_descriptors=tuple(descriptors), scalar_locals=scalars,
        pointer_params=pointers, register_loads=_register_loads(new_roles),
        shared_chunks=tuple(chunks.values())))


# elements of a register-staged tile each producer thread holds at once, and the producer's
# registers: the chunk's values, its addresses and masks (64 registers spilled 40 bytes with both
# of a 128x256x64 GEMM's operands loaded this way; 96 none, leaving 208 to two consumer warp groups)
REGISTER_LOAD_ELEMENTS = 16
REGISTER_LOAD_REGS = 96
# registers of a gemm role other than the default partition (a split consumer), where they fit
GEMM_WORKER_REGS = 232


def _register_loads(role_list) -> tuple:
    """(shared buffer, rows per chunk, layout) of each global -> shared copy through registers:
    chunks of whole rows, at least 8 (a swizzle atom of the shared layout), of about
    ``REGISTER_LOAD_ELEMENTS`` elements per thread, each thread holding 16 consecutive bytes of
    a row (one vector store into shared memory; the loads are as wide as the rows' alignment
    lets Triton make them)."""
    out = {}
    for r in role_list:
        for s in walk(r.body):
            if _loads_through_registers(s):
                rows, cols = s.dst.tile_shape
                vector = max(1, min(cols, 16 // s.dst.buffer.dtype.itemsize))
                across = max(1, min(32, cols // vector))
                threads = 32 * r.num_warps
                chunk = max(8, (32 // across) * r.num_warps, REGISTER_LOAD_ELEMENTS * threads // cols)
                while chunk > rows or rows % chunk:
                    chunk //= 2
                out[s.dst.buffer.name] = (chunk, Blocked(2, r.num_warps, vector, across))
    return tuple((name, chunk, layout) for name, (chunk, layout) in out.items())


def _scalar_locals(kernel: ir.Kernel, ws: ir.WarpSpecialize) -> tuple:
    """Check the local buffers (scalars, defined at their role's top level before any use) and
    say which of them are never negative."""
    scalars = []
    for s in kernel.body.stmts:
        if not isinstance(s, (ir.Alloc, ir.WarpSpecialize)):
            raise _Refuse(f"a {type(s).__name__.lower()} outside the roles (line {s.loc.line})")
        if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.LOCAL:
            b = s.buffer
            if b.static_shape != (1,) or b.dtype not in _SCALAR_DTYPES:
                raise _Refuse(f"local buffer '{b.name}' ({b.dtype.value}{list(b.static_shape)}) is "
                              f"not an i32 or f32 scalar (line {s.loc.line})")
            scalars.append(b)
    for r in ws.roles:
        for s in _statements(r.body):
            if isinstance(s, ir.Alloc):
                raise _Refuse(f"an allocation inside a role (line {s.loc.line})")
            _check_scalar_access(s)
        _check_defined(r, r.body, set())
    stores = [s for s in walk(ws) if isinstance(s, ir.Store)]
    nonneg = set(scalars) - {s.prev for s in walk(ws) if isinstance(s, ir.AtomicAdd)}
    while True:                                    # the largest set closed under the stores
        bad = {s.buffer for s in stores if s.buffer in nonneg and not _counts(s.value, nonneg)}
        if not bad:
            break
        nonneg -= bad
    return tuple((b.name, b in nonneg) for b in scalars)


def _statements(s: ir.Stmt):
    """``walk``, except that a ``T.Parallel`` is one statement (``_check_parallel`` looks inside)."""
    return walk(s, opaque=(ir.Parallel,))


def _check_parallel(p: ir.Parallel, laid_out: dict, chunked: set) -> None:
    """The fragment math the Gluon emitter spells (see the module docstring); ``chunked``: the
    ids of the shared accesses ``_check_per_thread`` accepted."""
    line = p.loc.line
    if len(p.vars) > 2:
        raise _Refuse(f"a {len(p.vars)}-d T.Parallel (line {line}); fragments are 1-d or 2-d")
    for s in walk(p.body):
        if isinstance(s, ir.If):
            continue
        if isinstance(s, ir.AtomicAdd):
            _check_atomic(s)
            continue
        if not isinstance(s, ir.Store):
            raise _Refuse(f"a {type(s).__name__.lower()} inside T.Parallel (line {s.loc.line})")
        b = s.buffer
        if id(s) in chunked or p.per_thread and per_thread_column(b, s.indices, p.vars, p.extents) is not None:
            continue
        if b.scope is ir.Scope.GLOBAL:
            used = {v for i in s.indices for v in subexprs(i) if isinstance(v, ir.Var)}
            if not set(p.vars) <= used:
                raise _Refuse(f"the store to '{b.name}' at line {s.loc.line} does not give each "
                              f"iteration of T.Parallel its own element")
            continue
        if b.scope is not ir.Scope.FRAGMENT:
            raise _Refuse(f"a store to {b.scope.value} buffer '{b.name}' inside T.Parallel "
                          f"(line {s.loc.line}); fragments and global memory only")
        if tuple(s.indices) != p.vars or tuple(b.static_shape) != tuple(p.extents):
            raise _Refuse(f"the store to '{b.name}' at line {s.loc.line} is not indexed by the "
                          f"loop's variables in order over its whole extent")
    for s in walk(p.body):
        for e in exprs_of(s):
            for x in subexprs(e):
                if not isinstance(x, ir.Load) or x.buffer.scope is ir.Scope.GLOBAL:
                    continue
                b = x.buffer
                if b.scope is ir.Scope.LOCAL or id(x) in chunked or _shared_element(x, p.vars, laid_out):
                    continue
                if p.per_thread and per_thread_column(b, x.indices, p.vars, p.extents) is not None:
                    continue
                if b.scope is not ir.Scope.FRAGMENT:
                    raise _Refuse(f"an element read of {b.scope.value} buffer '{b.name}' inside "
                                  f"T.Parallel (line {x.loc.line or s.loc.line})")
                whole = tuple(x.indices) == p.vars and tuple(b.static_shape) == tuple(p.extents)
                vector = (len(x.indices) == 1 and x.indices[0] in p.vars and
                          b.static_shape[0] == p.extents[p.vars.index(x.indices[0])])
                if not (whole or vector or gathered_axis(x, p.vars, p.extents) is not None):
                    raise _Refuse(f"fragment '{b.name}' is read at line {x.loc.line or s.loc.line} "
                                  f"at indices other than the loop's variables")



def _loops_around(s: ir.Stmt, outer: tuple) -> dict[int, tuple[ir.For, ...]]:
    """The loops around each ``Parallel`` in ``s`` (by id), outermost first."""
    if isinstance(s, ir.Parallel):
        return {id(s): outer}
    inner = outer + (s,) if isinstance(s, ir.For) else outer
    found: dict[int, tuple[ir.For, ...]] = {}
    for body in substmts(s):
        for t in body.stmts:
            found.update(_loops_around(t, inner))
    return found


def _unroll(body: ir.Seq, loops: set) -> ir.Seq:
    """``body`` with the loops ``loops`` names ((var, loc)) unrolled."""
    return rewrite(body, lambda s: dataclasses.replace(s, kind=ir.ForKind.UNROLL)
                   if isinstance(s, ir.For) and (s.var, s.loc) in loops else None)


def _check_per_thread(p: ir.Parallel, frames: dict, pipeline, chunks: dict, around: tuple,
                      unrolled: set) -> set[int]:
    """Per-thread code touching shared memory element by element: Gluon names shared memory only
    as whole tiles and views of them (``.index``, ``.reshape``, ``.slice``), loaded into or
    stored from register tensors; it has no element address there, so no gather, scatter or
    atomic. A read, or an unmasked store, of one aligned run of a shared tile (``_chunk``) is a
    row slice of the tile: its id is returned, its slice recorded in ``chunks`` and the loops
    its start depends on (of ``around``, the loops around ``p``) added to ``unrolled``.
    Any other access is refused, checked first to say so rather than call the loop a
    ``T.Parallel`` the program never wrote."""
    why = "Gluon reads and writes shared memory only as whole tiles, not at per-thread indices"
    frame = frames.get(p.vars[0].name)
    chunked: set[int] = set()
    for s in walk(p.body):
        if isinstance(s, ir.AtomicAdd) and s.dst.buffer.scope is ir.Scope.SHARED:
            raise _Refuse(f"per-thread code at line {s.loc.line} adds atomically into shared "
                          f"buffer '{s.dst.buffer.name}': Gluon has no atomics on shared memory")
        if isinstance(s, ir.Store) and s.buffer.scope is ir.Scope.SHARED:
            unmasked = any(t is s for t in p.body.stmts)
            if not (unmasked and _chunk(p, frame, pipeline, s.buffer, s.indices, chunks, around,
                                        unrolled, s.loc.line)):
                raise _Refuse(f"per-thread code at line {s.loc.line} stores into shared buffer "
                              f"'{s.buffer.name}' at thread-computed indices: {why}")
            chunked.add(id(s))
        for x in (x for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)):
            if x.buffer.scope is ir.Scope.SHARED:
                if not _chunk(p, frame, pipeline, x.buffer, x.indices, chunks, around, unrolled,
                              x.loc.line or s.loc.line):
                    raise _Refuse(f"per-thread code at line {x.loc.line or s.loc.line} reads shared "
                                  f"buffer '{x.buffer.name}' at thread-computed indices: {why}")
                chunked.add(id(x))
    return chunked


def _row_runs(p: ir.Parallel, frames: dict, pipeline, chunks: dict) -> set[int]:
    """The ids of a ``T.Parallel``'s reads of whole rows of a shared tile, ``S[i + c, j]`` over
    all its columns, ``c`` a constant (a staged tile stored to global memory by element under a
    row bound; split_consumers' halves add their first row): each a row slice of the tile loaded
    in the loop's layout (``SharedChunk``). Other shared reads are left to ``_check_parallel``."""
    frame = frames.get(p.vars[0].name)
    out: set[int] = set()
    for x in (x for s in walk(p.body) for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)):
        b = x.buffer
        if b.scope is not ir.Scope.SHARED or len(p.vars) != 2:
            continue
        tile = slot_shape(b, pipeline)
        slots = len(b.shape) - len(tile)
        start = None if len(tile) != 2 or p.extents[1] != tile[1] or p.extents[0] % 8 else \
            chunk_start(tile, x.indices[slots:], p.vars, p.extents)
        size = math.prod(p.extents)
        known = chunks.get((b.name, size))
        if start is None or any(isinstance(v, ir.Var) for v in subexprs(start)) \
                or any(v in p.vars for i in x.indices[:slots] for v in subexprs(i)) \
                or known is not None and known.layout != frame:
            continue
        chunks[(b.name, size)] = SharedChunk(b.name, size, slots, p.extents[0], frame)
        out.add(id(x))
    return out


def _chunk(p: ir.Parallel, frame, pipeline, b: ir.Buffer, indices, chunks: dict, around: tuple,
           unrolled: set, line: int) -> bool:
    """Whether ``b[indices]`` (its ring slot indexed uniformly) is one aligned run of whole rows
    of the tile, a multiple of 8 (any swizzle's period), (``lowering/chunks.py``) in per-thread
    code running in infer_layouts' per-thread layout, whose thread t's elements are
    t * n .. t * n + n - 1 of a [rows, cols] register tensor of at most 32 threads along a row;
    records the slice and the loops to unroll (``_static_start``)."""
    tile = slot_shape(b, pipeline)
    slots = len(b.shape) - len(tile)
    start = None if len(tile) != 2 else chunk_start(tile, indices[slots:], p.vars, p.extents)
    if start is None or any(v in p.vars for i in indices[:slots] for v in subexprs(i)):
        return False
    size, cols = math.prod(p.extents), tile[1]
    vector = p.extents[1] if len(p.vars) == 2 else 1
    threads = p.extents[0]
    warps = threads // 32
    per_thread = Blocked(len(p.vars), warps, *((vector, 1) if len(p.vars) == 2 else ()))
    if frame != per_thread or threads % 32 or size % (8 * cols) or cols % vector or cols // vector > 32:
        return False
    unrolled.update(_static_start(start, around, b, line))
    chunks[(b.name, size)] = SharedChunk(b.name, size, slots, size // cols,
                                         Blocked(2, warps, vector, cols // vector))
    return True


def _static_start(start: ir.Expr, around: tuple, b: ir.Buffer, line: int) -> set:
    """The loops (of ``around``: (var, loc)) to unroll so that a run of shared tile ``b``
    starting at ``start`` starts at a row known when the kernel is compiled (Gluon slices shared
    memory at static rows only): those whose variables ``start`` reads, each of constant bounds
    around per-thread code only; refused where ``start`` reads anything else."""
    loops = {f.var: f for f in around}
    out = set()
    for v in {x for x in subexprs(start) if isinstance(x, ir.Var)}:
        f = loops.get(v)
        if f is None or any(ir.as_int(x) is None for x in (f.start, f.stop, f.step)) or not all(
                isinstance(t, (ir.Parallel, ir.For, ir.If)) for t in walk(f.body, opaque=(ir.Parallel,))):
            raise _Refuse(f"per-thread code at line {line} reads or writes a run of shared buffer "
                          f"'{b.name}' starting at a row that depends on '{v.name}', known only "
                          f"at run time: Gluon slices shared tiles at rows known when the kernel "
                          f"is compiled (a constant-bounds loop of per-thread code is unrolled "
                          f"for it)")
        out.add((f.var, f.loc))
    return out


def _shared_element(x: ir.Load, loop_vars, laid_out: dict) -> bool:
    """Whether ``x`` reads one element of a shared vector (unswizzled, its ring slot indexed) at
    indices that do not involve the loop's variables, a value every iteration shares (the
    emitter loads it broadcast)."""
    layout = laid_out.get(x.buffer.name)
    used = {v for i in x.indices for v in subexprs(i)}
    return x.buffer.scope is ir.Scope.SHARED and isinstance(layout, NVMMAShared) \
        and layout.rank == 1 and not used & set(loop_vars)


def _check_atomic(s: ir.AtomicAdd) -> None:
    """Element adds to global memory (one per block outside ``T.Parallel``, one per iteration
    inside), and shared tiles added into global memory (bulk reduce-adds)."""
    if isinstance(s.value, ir.Region):
        if not bulk_reduce(s) or s.order != "relaxed":
            raise _Refuse(f"a tile T.atomic_add other than a relaxed add of a shared tile into "
                          f"global memory (line {s.loc.line}); add a fragment through a shared tile")
        return          # its box is checked with the bulk copies' (the descriptors)
    if s.dst.buffer.scope is not ir.Scope.GLOBAL:
        raise _Refuse(f"T.atomic_add to {s.dst.buffer.scope.value} buffer '{s.dst.buffer.name}' "
                      f"(line {s.loc.line}); global memory only")


def _as_copy(s: ir.AtomicAdd) -> ir.Copy:
    """A bulk reduce-add as the bulk store it is spelled like (its tile, its descriptor)."""
    return ir.Copy(s.value, s.dst, mechanism=ir.CopyMechanism.TMA, loc=s.loc)


def _check_reduce(s: ir.Reduce) -> None:
    if s.src.scope is not ir.Scope.FRAGMENT or s.dst.scope is not ir.Scope.FRAGMENT \
            or len(s.src.shape) != 2 or len(s.dst.shape) != 1:
        raise _Refuse(f"a reduction other than a 2-d fragment into a 1-d fragment (line {s.loc.line})")


def _check_scalar_access(s: ir.Stmt) -> None:
    if isinstance(s, ir.Store) and s.buffer.scope is not ir.Scope.LOCAL:
        raise _Refuse(f"a store to {s.buffer.scope.value} buffer '{s.buffer.name}' (line {s.loc.line})")
    if isinstance(s, ir.Parallel):
        return                              # _check_parallel
    index = s.indices if isinstance(s, ir.Store) else ()
    loads = [x for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)]
    for x in loads:
        if x.buffer.scope not in (ir.Scope.LOCAL, ir.Scope.GLOBAL):
            raise _Refuse(f"an element read of {x.buffer.scope.value} buffer '{x.buffer.name}' "
                          f"(line {x.loc.line or s.loc.line})")
    for idx in [index] + [x.indices for x in loads if x.buffer.scope is ir.Scope.LOCAL]:
        if tuple(ir.as_int(i) for i in idx) not in ((), (0,)):
            raise _Refuse(f"a scalar local indexed by something other than 0 (line {s.loc.line})")


def _check_defined(role: ir.Role, body: ir.Seq, outer: set) -> None:
    """Each scalar local is stored (or receives an atomic's old value) before it is read, in the
    same statement list or an enclosing one: a role's scalars are Python variables of its
    function, and one defined inside a loop or branch exists only there."""
    defined = set(outer)
    for top in body.stmts:
        if isinstance(top, ir.Store):
            _require_defined(role, buffers_read(top), defined, top)
            if top.value.dtype != top.buffer.dtype:
                raise _Refuse(f"a {top.value.dtype.value} value stored to {top.buffer.dtype.value} "
                              f"scalar '{top.buffer.name}' (line {top.loc.line})")
            defined.add(top.buffer)
        elif isinstance(top, ir.AtomicAdd) and top.prev is not None:
            _require_defined(role, buffers_read(top), defined, top)
            defined.add(top.prev)
        elif isinstance(top, ir.For):
            _require_defined(role, [x.buffer for e in (top.start, top.stop, top.step)
                                    for x in subexprs(e) if isinstance(x, ir.Load)], defined, top)
            _check_defined(role, top.body, defined)
        elif isinstance(top, ir.If):
            _require_defined(role, [x.buffer for x in subexprs(top.cond) if isinstance(x, ir.Load)],
                             defined, top)
            _check_defined(role, top.then, defined)
            _check_defined(role, top.orelse, defined)
        else:
            _require_defined(role, [b for s in walk(top) for b in buffers_read(s) + buffers_written(s)],
                             defined, top)


def _require_defined(role: ir.Role, used, defined: set, s: ir.Stmt) -> None:
    for b in used:
        if b.scope is ir.Scope.LOCAL and b not in defined:
            raise _Refuse(f"scalar '{b.name}' of {roles.describe(role.warpgroups)} is used at line "
                          f"{s.loc.line} before a store in its scope (or an enclosing one) "
                          f"defines it")


def _counts(e: ir.Expr, nonneg: set) -> bool:
    """Whether ``e`` is non-negative when the scalars ``nonneg`` are."""
    if isinstance(e, ir.Const):
        return e.value >= 0
    if isinstance(e, ir.Load):
        return e.buffer in nonneg
    return isinstance(e, ir.BinOp) and e.op in _COUNTING and _counts(e.a, nonneg) and _counts(e.b, nonneg)


def _pointer_params(kernel: ir.Kernel, ws: ir.WarpSpecialize) -> tuple:
    """The global buffers read by element loads, copied by other than TMA (into fragments or
    shared memory, or from fragments) or stored element-wise, each with the roles accessing
    it."""
    readers: dict[str, list] = {}
    for r in ws.roles:
        for s in walk(r.body):
            read = [x.buffer for e in exprs_of(s) for x in subexprs(e)
                    if isinstance(x, ir.Load) and x.buffer.scope is ir.Scope.GLOBAL]
            if isinstance(s, ir.Store) and s.buffer.scope is ir.Scope.GLOBAL:
                read.append(s.buffer)          # element stores of T.Parallel address it too
            if isinstance(s, ir.AtomicAdd):
                read.append(s.dst.buffer)
            if isinstance(s, ir.Copy) and s.mechanism is not ir.CopyMechanism.TMA:
                read += [r.buffer for r in (s.src, s.dst) if r.buffer.scope is ir.Scope.GLOBAL]
            for b in read:
                who = readers.setdefault(b.name, [])
                if r.warpgroups not in who:
                    who.append(r.warpgroups)
    return tuple((b.name, tuple(readers[b.name])) for b in kernel.buffer_params if b.name in readers)


def _seq(body: ir.Seq, layouts: dict, registers: bool) -> ir.Seq:
    """Decide the statements of one statement list (recursing into loops)."""
    out: list[ir.Stmt] = []
    stmts = body.stmts
    for i, s in enumerate(stmts):
        if isinstance(s, ir.For):
            out.append(dataclasses.replace(s, body=_seq(s.body, layouts, registers)))
        elif isinstance(s, ir.If):
            out.append(dataclasses.replace(s, then=_seq(s.then, layouts, registers),
                                           orelse=_seq(s.orelse, layouts, registers)))
        elif isinstance(s, ir.Copy):
            decided = _copy(s, stmts[i + 1:], layouts, registers)
            if decided.mechanism is not ir.CopyMechanism.TMA:
                out.append(decided)
                continue
            out.extend(_boxes(decided))
            if s.dst.buffer.scope is ir.Scope.GLOBAL:
                out.append(ir.BulkStoreWait(0, s.loc))    # overlap_store may defer it
        elif isinstance(s, ir.Gemm):
            if s.a.buffer.dtype is ir.DType.F32 and s.precision is not ir.GemmPrecision.TF32:
                raise _Refuse(f"wgmma's float32 form rounds to tf32, and T.gemm at line "
                              f"{s.loc.line} asks for exact float32 products (precision='ieee')")
            _check_wgmma_shape(s, layouts)
            if s.b.buffer.scope is not ir.Scope.SHARED:
                raise _Refuse(f"gemm operand B is not in shared memory (line {s.loc.line})")
            if s.a.buffer.scope is ir.Scope.FRAGMENT:
                if s.transpose_a or len(s.a.buffer.shape) != 2 or not s.a.is_whole:
                    raise _Refuse(f"gemm operand A in registers must be a whole, untransposed 2-d "
                                  f"fragment (line {s.loc.line})")
            elif s.a.buffer.scope is not ir.Scope.SHARED:
                raise _Refuse(f"gemm operand A is in {s.a.buffer.scope.value} memory (line {s.loc.line})")
            out.append(dataclasses.replace(s, instr=ir.GemmInstr.WGMMA))
            if not _issued_with(s, stmts[i + 1:i + 2]):
                out.append(ir.GemmWait(0, s.loc))
        elif isinstance(s, ir.Fill) and s.dst.buffer.scope is not ir.Scope.FRAGMENT:
            raise _Refuse(f"fill of {s.dst.buffer.scope.value} memory (line {s.loc.line})")
        elif bulk_reduce(s):
            out.extend((s, ir.BulkStoreWait(0, s.loc)))
        else:
            out.append(s)
    return dataclasses.replace(body, stmts=_registers_first(out))


def _issued_with(s: ir.Gemm, following: tuple) -> bool:
    """The next statement is a gemm that may be in flight together with ``s``: it reads no
    accumulator ``s`` writes (the same accumulator, chained, is fine: wgmma accumulates in order)."""
    return bool(following) and isinstance(following[0], ir.Gemm) \
        and s.c.buffer not in (following[0].a.buffer, following[0].b.buffer)


def _registers_first(stmts: list) -> tuple:
    """Runs of global -> shared copies into distinct buffers (independent) with the copies
    through registers first and, when TMA copies follow, a proxy fence between: the role's own
    stores are then fenced before the expect that arrives ahead of the TMA bytes (the
    barrier's tx-count is never asked to go negative)."""
    out, run = [], []

    def flush():
        staged = [c for c in run if c.mechanism is not ir.CopyMechanism.TMA]
        bulk = [c for c in run if c.mechanism is ir.CopyMechanism.TMA]
        if staged and bulk:
            if {c.dst.buffer for c in staged} & {c.dst.buffer for c in bulk}:
                raise _Refuse(f"copies through registers and bulk copies fill the same shared "
                              f"buffer (line {run[0].loc.line})")
            out.extend(staged + [ir.ProxyFence(staged[-1].loc)] + bulk)
        else:
            out.extend(run)
        run.clear()
    for s in stmts:
        if isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.GLOBAL \
                and s.dst.buffer.scope is ir.Scope.SHARED:
            run.append(s)
        else:
            flush()
            out.append(s)
    flush()
    return tuple(out)


def _check_wgmma_shape(s: ir.Gemm, layouts: dict) -> None:
    """docs/ws-semantics.md #3 and the instruction's K step: refuse what wgmma cannot compute."""
    M, N = s.c.tile_shape
    k_tile = s.a.tile_shape[0 if s.transpose_a else -1]
    step = 256 // s.a.buffer.dtype.bits
    if not isinstance(layouts.get(s.c.buffer.name), WgmmaAccumulator):
        raise _Refuse(f"no wgmma warp partition fits the {M}x{N} tile of T.gemm at line "
                      f"{s.loc.line}: block_M must be a multiple of 64 per consumer warp group "
                      f"and block_N of 8")
    if k_tile % step:
        raise _Refuse(f"the reduction dim of T.gemm at line {s.loc.line} is {k_tile}, not a "
                      f"multiple of wgmma's k step {step} for {s.a.buffer.dtype.value}")
    if s.a.buffer.dtype.is_fp8 and (s.transpose_a or not s.transpose_b):
        raise _Refuse(f"FP8 wgmma reads K-major operands only, and the "
                      f"{'A' if s.transpose_a else 'B'} tile of T.gemm at line {s.loc.line} is "
                      f"stored {'M' if s.transpose_a else 'N'}-major (B as [K, N]; give B as [N, K] "
                      f"with transpose_B=True for the warp-specialized path)")
    if s.a.buffer.dtype is ir.DType.F32 and (s.transpose_a or not s.transpose_b):
        raise _Refuse(f"tf32 wgmma reads K-major operands only, and the "
                      f"{'A' if s.transpose_a else 'B'} tile of T.gemm at line {s.loc.line} is "
                      f"stored {'M' if s.transpose_a else 'N'}-major")


def _fence(body: ir.Seq, pending: set, async_read: set) -> ir.Seq:
    """Insert a proxy fence before an asynchronous read of shared memory this role wrote with
    ordinary stores since the last fence, and before an arrival that publishes such writes of a
    buffer some role reads asynchronously (a producer's register-staged tile, which a consumer's
    wgmma reads after waiting on that barrier); ``pending`` is updated in place."""
    out: list[ir.Stmt] = []
    for s in body.stmts:
        if isinstance(s, ir.For):
            carried = set(pending)
            _fence(s.body, carried, async_read)     # what one iteration leaves for the next
            pending |= carried
            s = dataclasses.replace(s, body=_fence(s.body, pending, async_read))
        elif isinstance(s, ir.If):
            then_p, else_p = set(pending), set(pending)
            s = dataclasses.replace(s, then=_fence(s.then, then_p, async_read),
                                    orelse=_fence(s.orelse, else_p, async_read))
            pending |= then_p | else_p
        elif isinstance(s, ir.ProxyFence):
            pending.clear()
        elif async_shared_reads(s) & pending or isinstance(s, ir.BarrierArrive) and pending & async_read:
            out.append(ir.ProxyFence(s.loc))
            pending.clear()
        pending |= generic_shared_writes(s)
        out.append(s)
    return dataclasses.replace(body, stmts=tuple(out))


def _copy(s: ir.Copy, rest: tuple, layouts: dict, registers: bool) -> ir.Copy:
    src, dst = s.src.buffer.scope, s.dst.buffer.scope
    if src is ir.Scope.GLOBAL and dst is ir.Scope.FRAGMENT:
        # a tile loaded into registers (an epilogue's bias): legalize's masking stands
        lay = layouts.get(s.dst.buffer.name)
        if not s.dst.is_whole or s.src.tile_shape != s.dst.buffer.static_shape \
                or len(s.dst.buffer.shape) > 2 or isinstance(lay, WgmmaOperandA):
            raise _Refuse(f"a global -> fragment copy other than a whole 1-d or 2-d fragment in "
                          f"an accumulator-like layout (line {s.loc.line})")
        return s
    if src is ir.Scope.FRAGMENT and dst is ir.Scope.GLOBAL:
        # left unstaged by warp_specialize (a release follows) or a leading block of a fragment
        # (registerize: GQA decode's valid heads): stored from registers
        leading = all(ir.as_int(x) == 0 for x in s.src.starts)
        if not leading or s.dst.tile_shape != s.src.tile_shape \
                or len(s.src.buffer.shape) > 2 or isinstance(layouts.get(s.src.buffer.name), WgmmaOperandA):
            raise _Refuse(f"a fragment -> global copy other than a whole 1-d or 2-d fragment (or "
                          f"its leading block) in an accumulator-like layout (line {s.loc.line})")
        return s
    if src is ir.Scope.GLOBAL and dst is ir.Scope.SHARED:
        bar = s.barrier or _completing_barrier(s, rest)
        if bar is None:
            raise _Refuse(f"the copy at line {s.loc.line} is not followed by a barrier arrival "
                          f"that could complete it asynchronously")
        tma = dataclasses.replace(s, barrier=bar, mechanism=ir.CopyMechanism.TMA)
        if registers and any(_tma_problem(box) is not None for box in _boxes(tma)):
            # through registers, before the arrival on ``bar`` (a plain one, after a fence)
            return dataclasses.replace(s, barrier=None)
        return tma
    if src is ir.Scope.SHARED and dst is ir.Scope.GLOBAL:
        return dataclasses.replace(s, mechanism=ir.CopyMechanism.TMA)
    if src is ir.Scope.SHARED and dst is ir.Scope.FRAGMENT:
        # a vector read from shared memory (block-wise FP8's row scales from their ring slot),
        # a packed tile read for fragment math (a dequantizing GEMM's B_shared -> B_local)
        if not s.dst.is_whole or len(s.dst.buffer.shape) > 2 \
                or s.src.tile_shape != s.dst.buffer.static_shape:
            raise _Refuse(f"a shared -> fragment copy other than a shared tile into a whole 1-d "
                          f"or 2-d fragment (line {s.loc.line})")
        return dataclasses.replace(s, mechanism=ir.CopyMechanism.DIRECT)
    if src is ir.Scope.FRAGMENT and dst in (ir.Scope.SHARED, ir.Scope.FRAGMENT):
        if dst is ir.Scope.FRAGMENT and not (s.src.is_whole and s.dst.is_whole
                                             and s.src.tile_shape == s.dst.tile_shape) \
                and _line_of(s) is None:
            raise _Refuse(f"a copy between parts of fragments other than a whole vector into one "
                          f"row or column of a 2-d fragment (line {s.loc.line})")
        return dataclasses.replace(s, mechanism=ir.CopyMechanism.DIRECT)
    raise _Refuse(f"a {src.value} -> {dst.value} copy (line {s.loc.line})")


def _line_of(s: ir.Copy) -> Optional[int]:
    """For a copy of a whole 1-d fragment into one row or column of a 2-d fragment (a score
    column ``S[:, k]``), the dim the row or column is fixed in; else None."""
    shape = s.dst.buffer.static_shape
    if not (s.src.is_whole and len(s.src.buffer.shape) == 1 and len(shape) == 2
            and s.src.buffer.scope is s.dst.buffer.scope is ir.Scope.FRAGMENT):
        return None
    fixed = [d for d in (0, 1) if s.dst.extents[d] == 1 and shape[d] != 1]
    if len(fixed) != 1:
        return None
    other = 1 - fixed[0]
    whole = ir.as_int(s.dst.starts[other]) == 0 and s.dst.extents[other] == shape[other]
    return fixed[0] if whole and s.src.buffer.static_shape == (shape[other],) else None


def _completing_barrier(s: ir.Copy, rest: tuple) -> Optional[ir.BarrierRef]:
    """The barrier of the first arrival after ``s`` if nothing in between reads its bytes."""
    for t in rest:
        if isinstance(t, ir.BarrierArrive):
            return t.barrier
        if any(s.dst.buffer in buffers_read(u) for u in walk(t)) or isinstance(t, (ir.For, ir.BarrierWait)):
            return None
    return None


def _boxes(s: ir.Copy) -> tuple[ir.Copy, ...]:
    """The TMA copy ``s`` as copies of boxes of at most ``TMA_BOX`` elements a dim: a tile whose
    dim is a larger power of two (MLA's 512-wide latent rows) becomes one copy per ``TMA_BOX``
    elements of that dim, global box and shared slice alike, in order; loads complete on ``s``'s
    barrier, so its expect counts every box's bytes."""
    glob, smem = (s.src, s.dst) if s.src.buffer.scope is ir.Scope.GLOBAL else (s.dst, s.src)
    pairs = list(zip((d for d, e in enumerate(glob.extents) if e != 1),
                     (d for d, e in enumerate(smem.extents) if e != 1)))
    pieces = [(glob, smem)]
    for gd, sd in pairs:
        extent = glob.extents[gd]
        if extent <= TMA_BOX or extent % TMA_BOX or smem.extents[sd] != extent:
            continue
        pieces = [(_shifted(g, gd, at), _shifted(m, sd, at))
                  for g, m in pieces for at in range(0, extent, TMA_BOX)]
    if len(pieces) == 1:
        return (s,)
    if glob is s.src:
        return tuple(dataclasses.replace(s, src=g, dst=m) for g, m in pieces)
    return tuple(dataclasses.replace(s, src=m, dst=g) for g, m in pieces)


def _shifted(r: ir.Region, dim: int, at: int) -> ir.Region:
    """The ``TMA_BOX`` elements of ``r`` from ``at`` along ``dim``."""
    start = shifted(r.starts[dim], at)
    return dataclasses.replace(r, starts=r.starts[:dim] + (start,) + r.starts[dim + 1:],
                               extents=r.extents[:dim] + (TMA_BOX,) + r.extents[dim + 1:])


def _global(s: ir.Copy) -> ir.Buffer:
    return s.src.buffer if s.src.buffer.scope is ir.Scope.GLOBAL else s.dst.buffer


def _check_tma(s: ir.Copy) -> None:
    problem = _tma_problem(s)
    if problem is not None:
        raise _Refuse(problem)


def _tma_problem(s: ir.Copy) -> Optional[str]:
    """Why the copy ``s`` cannot be a bulk (TMA) copy, or None."""
    g = _global(s)
    box = s.src.extents if g is s.src.buffer else s.dst.extents
    pitch = row_bytes(g)
    if pitch is None:
        return (f"'{g.name}' has a runtime dimension after its first; its bulk-copy descriptor "
                f"needs static strides (line {s.loc.line})")
    if not bulk_copy_tensor(g):
        loads = (" (pass config tl.enable_lower_ldgstg loads such tiles through the producer's "
                 "registers)" if s.dst.buffer.scope is ir.Scope.SHARED else "")
        return (f"rows of '{g.name}' are {pitch} bytes, not a multiple of 16, so it cannot "
                f"be a bulk-copy (TMA) operand (line {s.loc.line}){loads}")
    if any(b > TMA_BOX or not ir.is_power_of_two(b) for b in box) or box[-1] * g.dtype.itemsize < 16:
        return (f"tile {list(box)} of '{g.name}' is no bulk-copy box: each dim a power of two "
                f"of at most 256 elements (Triton's descriptors), the inner one at least 16 bytes "
                f"(line {s.loc.line})")
    return None


def _has_gemm(r: ir.Role) -> bool:
    return any(isinstance(s, ir.Gemm) for s in walk(r.body))


def _default_role(role_list) -> ir.Role:
    holders = [r for r in role_list if _has_gemm(r)]
    if not holders:
        raise _Refuse("no role computes a gemm")
    return holders[0]


def _copy_only(r: ir.Role) -> bool:
    """Only bulk loads, barrier operations, loops, branches and scalar bookkeeping."""
    return all(isinstance(s, (ir.For, ir.If, ir.Store, ir.BarrierWait, ir.BarrierArrive)) or
               (isinstance(s, ir.Copy) and s.mechanism is ir.CopyMechanism.TMA
                and s.dst.buffer.scope is ir.Scope.SHARED)
               for s in walk(r.body))


def _register_loading(r: ir.Role) -> bool:
    return any(_loads_through_registers(s) for s in walk(r.body))


def _loads_through_registers(s: ir.Stmt) -> bool:
    return (isinstance(s, ir.Copy) and s.mechanism is not ir.CopyMechanism.TMA
            and s.src.buffer.scope is ir.Scope.GLOBAL and s.dst.buffer.scope is ir.Scope.SHARED)


def _budget(role_list, default: ir.Role):
    """Warps and registers per role: copy-only roles 1 warp at 24 registers; other workers
    without gemms 4 warps per warp group (``REGISTER_LOAD_REGS`` registers for one loading tiles
    through registers, 64 else); other roles holding gemms an even share per thread of what
    those leave to all gemm roles, at most ``GEMM_WORKER_REGS``; the default partition the rest
    of the register file, at most 256. A worker's own request (``T.set_max_nreg``: a source
    role's ``num_regs``) replaces its choice; the default partition's cannot (Triton gives it what
    the workers leave). The default partition's warps must be a power of two (Triton's
    num_warps)."""
    warps = 4 * len(default.warpgroups)
    if not ir.is_power_of_two(warps):
        raise _Refuse(f"the role {roles.describe(default.warpgroups)} holding the gemms would be "
                      f"the kernel's {warps} warps, not a power of two (Triton's num_warps): a "
                      f"consumer of {len(default.warpgroups)} warp groups runs only split in one role "
                      f"per warp group (split_consumers)")
    workers = [r for r in role_list if r is not default]
    budget = {r.warpgroups: (1, r.num_regs or 24) if _copy_only(r) else
              (4 * len(r.warpgroups),
               r.num_regs or (REGISTER_LOAD_REGS if _register_loading(r) else 64))
              for r in workers if not _has_gemm(r)}
    def left() -> int:      # a worker occupies whole warp groups
        return REGISTER_FILE - sum(128 * len(w) * regs for w, (_, regs) in budget.items())
    gemm_threads = 128 * sum(len(r.warpgroups) for r in role_list if _has_gemm(r))
    share = min(GEMM_WORKER_REGS, left() // gemm_threads // 8 * 8)
    budget.update({r.warpgroups: (4 * len(r.warpgroups), r.num_regs or share)
                   for r in workers if _has_gemm(r)})
    regs = min(256, left() // (128 * len(default.warpgroups)) // 8 * 8)
    if regs < 24:
        raise CompileError(f"the roles' register requests leave {regs} registers per thread for "
                           f"{roles.describe(default.warpgroups)}", default.loc)
    budget[default.warpgroups] = warps, regs
    return tuple(dataclasses.replace(r, num_warps=budget[r.warpgroups][0], num_regs=budget[r.warpgroups][1])
                 for r in role_list)


def _mbarrier_counts(kernel: ir.Kernel) -> tuple:
    arrivals = protocol.arriving_roles(kernel.body)
    return tuple((s.buffer.name, protocol.phase_arrivals(s.buffer, arrivals.get(s.buffer.name, ())))
                 for s in walk(kernel.body)
                 if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER)

