"""warp_specialize: split a program into concurrently running roles.

Requires:  plan_pipeline has run.
Ensures:   * explicit ``T.ws`` programs: block-wide allocations followed by one ``WarpSpecialize``
             with each role's projection (``roles.split``);
           * a kernel with a ``pipeline`` plan (targets with warp-group MMA): one producer role
             ``ws(0)`` running the loop's copies into ``stages``-deep ring buffers (a leading stage
             dimension; at least ``MIN_RING_STAGES`` deep where the loop asks for fewer and
             ``plan_buffers`` would place the deeper form, after the passes between, within
             ``config.caps.smem_bytes``: a note says which, and the ``PipelinePlan`` records
             the depth), each stage guarded by a *full*/*empty* barrier pair — the producer waits
             ``empty[s]`` with parity ``((i // S) & 1) ^ 1``, copies on ``full[s]`` and arrives
             on it; and one consumer role of ``threads / 128`` warp groups ``ws(1..n)`` that holds
             the prelude, waits ``full[s]`` with parity ``(i // S) & 1``, computes, arrives on
             ``empty[s]``, and runs the epilogue, whose fragment -> global copies are staged
             through shared memory (a proxy fence between) unless the kernel reads what they
             write (a partial tile another block sums: they stay register stores). The plan's
             ``preloads`` (copies
             before the loop, e.g. attention's Q tile) are issued by the producer before its loop
             on a ``preloaded`` barrier the consumer waits on (parity 0) where the first of them
             was; in a persistent kernel, per tile, into one of two slots (a leading dimension
             of 2 on each preloaded buffer, slot ``t % 2`` for the tile loop's iteration ``t``,
             one ``preloaded``/``reloadable`` barrier pair per slot) once the consumer has
             released that slot's previous tile (it arrives on ``reloadable`` after its loop):
             the next tile's preloads, and the ring copies after them, are issued while this
             tile computes. Where two slots would exceed ``config.caps.smem_bytes``, or the target
             asks for one (``preload_slots``), there is one (the next tile's loads wait for
             this tile's loop; a note says so where shared memory is why). ``threads`` grows
             by one warp group.
             When the loop body is guarded (``plan.guarded``), each role keeps the guard and
             counts the iterations that ran in a local counter; ``i`` is that count, so phases
             advance only on iterations that run (docs/ws-semantics.md #8). A persistent loop
             whose trip count varies from tile to tile (a stream-K segment's k range, a causal
             attention row) counts the same way, without a guard. In a persistent kernel (the
             loop inside a ``T.Persistent`` tile loop) both roles keep the tile loop; the
             producer's ring position is one running count over (tile, k), and the consumer keeps
             its prelude and epilogue per tile (docs/ws-semantics.md #11), so the producer loads the next
             tile while the consumer stores this one. The consumer's epilogue stages each
             fragment -> global copy through its own shared tile where ``config.caps.smem_bytes``
             holds them all and the target asks for it (``staging_per_store``, persistent kernels
             only: ``overlap_store`` then keeps their stores in flight together); otherwise
             copies of one tile shape share one staging tile; where even those would not fit
             beside the ring (the real placement), the epilogue stores from registers (a note):
             a ring slot serves every iteration, a staging tile one store per tile, so the
             two-slot ring is weighed with the stores unstaged (D256 attention).
             Explicit programs on targets with bulk copies get the same epilogue staging.
           * anything else: unchanged.
Preserves: program meaning (interpreter before == after, under any schedule) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .. import ir, roles, schedule
from ..capabilities import bulk_copy_tensor
from ..config import BackendConfig
from ..simplify import fold
from ..traverse import buffers_read, rewrite, subexprs, touched, walk
from ..plans import PipelinePlan, SharedMemoryPlan
from . import plan_buffers

MIN_RING_STAGES = 2
"""The fewest ring slots a warp-specialized loop gets where shared memory holds them: with one,
the producer cannot load block k + 1 until the consumer has released block k, so loads and
compute never overlap (H100, TileLang's varlen GQA decode at ``num_stages=1``: 1.03x
TileLang's time with one slot, 0.99x with two). A program's ``num_stages`` below it is TileLang's
request to its software pipeliner, not one for no prefetch."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if roles.role_sets(kernel.body):
        split = roles.split(kernel)
        return _stage_epilogues(split) if config.caps.tma else split
    plan: PipelinePlan | None = kernel.find_plan(PipelinePlan)
    if plan is None:
        return kernel
    if plan.stages >= MIN_RING_STAGES:
        return _specialized(kernel, plan, config)
    deeper = _specialized(kernel, dataclasses.replace(plan, stages=MIN_RING_STAGES), config)
    need = plan_buffers.peak_after("warp_specialize", deeper, config)
    loop = _pipelined_loop(kernel, plan)
    asked = f"the T.Pipelined loop at line {loop.loc.line} (num_stages={loop.num_stages})"
    if need <= config.caps.smem_bytes:
        return deeper.with_note(
            f"warp_specialize: {asked} gets a ring of {MIN_RING_STAGES} slots, so the producer "
            f"loads the next block while the consumer computes on this one ({need} bytes of "
            f"shared memory)")
    return _specialized(kernel, plan, config).with_note(
        f"warp_specialize: {asked} keeps a ring of {plan.stages} slot "
        f"(the producer loads the next block only once the consumer has released this one): "
        f"{MIN_RING_STAGES} slots would need {need} bytes of shared memory, more than the "
        f"{config.caps.smem_bytes} of target '{config.name}'")


def _specialized(kernel: ir.Kernel, plan: PipelinePlan, config: BackendConfig) -> ir.Kernel:
    """The automatic schedule with ``plan``'s ring depth: two slots for a persistent kernel's
    preloads where they fit (see the contract), else one."""
    persistent = plan.tile_loop_index is not None
    own_staging = persistent and config.policy.staging_per_store
    if not persistent or not plan.preloads or config.policy.preload_slots < 2:
        return _fitting(kernel, plan, 1, own_staging, config, unstaged=True)
    doubled = _fitting(kernel, plan, 2, own_staging, config, unstaged=False)
    need = SharedMemoryPlan.of(doubled.body).total_bytes
    if need <= config.caps.smem_bytes:
        return doubled
    return _fitting(kernel, plan, 1, own_staging, config, unstaged=True).with_note(
        f"warp_specialize: one slot for the preloads of each tile (the next tile's loads wait for "
        f"this tile's loop): two would need {need} bytes of shared memory, more than the "
        f"{config.caps.smem_bytes} of target '{config.name}'")


def _pipelined_loop(kernel: ir.Kernel, plan: PipelinePlan) -> ir.For:
    """The ``T.Pipelined`` loop ``plan`` describes (inside the tile loop of a persistent kernel)."""
    top = kernel.body.stmts
    body = top if plan.tile_loop_index is None else top[plan.tile_loop_index].body.stmts
    return body[plan.loop_index]


def _fitting(kernel: ir.Kernel, plan: PipelinePlan, preload_slots: int, own_staging: bool,
             config: BackendConfig, unstaged: bool) -> ir.Kernel:
    """``_auto``, each epilogue store staged in its own tile when asked and shared memory holds
    them, else one tile per shape shared by the stores (each waited for before the next); with
    ``unstaged``, where even those tiles would not fit beside the rings (D256 attention's
    128x256 output beside a 2-slot K/V ring), stores from registers, which need no shared
    memory: a ring slot serves every loop iteration, a staging tile one store per tile."""
    if own_staging:
        out = _auto(kernel, plan, preload_slots, staging="own")
        if SharedMemoryPlan.of(out.body).total_bytes <= config.caps.smem_bytes:
            return out
    out = _auto(kernel, plan, preload_slots, staging="shared")
    if not unstaged or SharedMemoryPlan.of(out.body).total_bytes <= config.caps.smem_bytes:
        return out
    need = plan_buffers.peak_after("warp_specialize", out, config)
    if need <= config.caps.smem_bytes:
        return out
    return _auto(kernel, plan, preload_slots, staging="registers").with_note(
        f"warp_specialize: the epilogue stores from registers: staging its stores through shared "
        f"memory would need {need} bytes, more than the {config.caps.smem_bytes} of target "
        f"'{config.name}'")


def _auto(kernel: ir.Kernel, plan: PipelinePlan, preload_slots: int, staging: str) -> ir.Kernel:
    """The automatic schedule; ``staging`` says how the epilogue's fragment -> global copies
    go: "own" (a staging tile each), "shared" (one per tile shape) or "registers" (unstaged)."""
    top = kernel.body.stmts
    tile_loop = None if plan.tile_loop_index is None else top[plan.tile_loop_index]
    body = top if tile_loop is None else tile_loop.body.stmts
    loop = _pipelined_loop(kernel, plan)
    loc = loop.loc
    c = lambda v: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    S = plan.stages
    consumers = kernel.threads // 128

    rings = {s.buffer: dataclasses.replace(s.buffer, shape=(c(S),) + s.buffer.shape)
             for s in top if isinstance(s, ir.Alloc) and s.buffer.name in plan.ring_buffers}

    guard = loop.body.stmts[0] if plan.guarded else None
    inner = guard.then.stmts if guard is not None else loop.body.stmts
    counters: list[ir.Alloc] = []

    trips = schedule.trip_count(loop, loc)
    per_tile_trips = tile_loop is None or not any(
        x == tile_loop.var or isinstance(x, ir.Load) for x in subexprs(trips))

    def role_loop(name: str, make_body) -> tuple[list[ir.Stmt], ir.For]:
        """(statements before the loops, the role's copy of the k loop). The ring slot follows
        the iteration number — across tiles in a persistent kernel, one running count — or, when
        iterations may be skipped or the trip count varies from tile to tile (a stream-K
        segment, a causal attention row), a counter of the iterations that ran (phases advance
        only on those)."""
        serial = dict(kind=ir.ForKind.SERIAL, num_stages=0)
        if guard is None and per_tile_trips:
            it = schedule.iteration(loop, loc)
            if tile_loop is not None:
                done = ir.BinOp(ir.BinOpKind.MUL, schedule.iteration(tile_loop, loc), trips,
                                ir.DType.I32, loc)
                it = ir.BinOp(ir.BinOpKind.ADD, done, it, ir.DType.I32, loc)
            stage, phase = schedule.ring_slot(fold(it), S, loc)
            return [], dataclasses.replace(loop, body=ir.Seq(make_body(stage, phase), loc), **serial)
        count = ir.Buffer(name, (c(1),), ir.DType.I32, ir.Scope.LOCAL, (), loc)
        counters.append(ir.Alloc(count, loc))
        ran = ir.Load(count, (c(0),), loc)
        stage, phase = schedule.ring_slot(ran, S, loc)
        bump = ir.Store(count, (c(0),), ir.BinOp(ir.BinOpKind.ADD, ran, c(1), ir.DType.I32, loc), loc)
        body = make_body(stage, phase) + (bump,)
        if guard is not None:
            body = (dataclasses.replace(guard, then=ir.Seq(body, loc)),)
        return ([ir.Store(count, (c(0),), c(0), loc)],
                dataclasses.replace(loop, body=ir.Seq(body, loc), **serial))

    producers = [inner[k] for k in plan.producers]
    consuming = [s for k, s in enumerate(inner) if k not in plan.producers]
    groups = _ring_groups(producers, consuming)

    def pair(suffix: str) -> tuple[ir.Buffer, ir.Buffer]:
        return (ir.Buffer("full" + suffix, (c(S),), ir.DType.I64, ir.Scope.BARRIER, (128,) * S, loc),
                ir.Buffer("empty" + suffix, (c(S),), ir.DType.I64, ir.Scope.BARRIER,
                          (128 * consumers,) * S, loc))
    bars = [pair("" if len(groups) == 1 else f"_{g.copies[0].dst.buffer.name}") for g in groups]

    def produce(stage, phase):
        restage = schedule.restager(rings, stage)
        bar = lambda b: ir.BarrierRef(b, stage, loc)  # noqa: E731
        out = []
        for g, (full, empty) in zip(groups, bars):
            out += [ir.BarrierWait(bar(empty), schedule.flipped(phase, loc), loc),
                    *(dataclasses.replace(restage(p), barrier=bar(full)) for p in g.copies),
                    ir.BarrierArrive(bar(full), loc)]
        return tuple(out)

    def consume(stage, phase):
        restage = schedule.restager(rings, stage)
        bar = lambda b: ir.BarrierRef(b, stage, loc)  # noqa: E731
        out = []
        for k, s in enumerate(consuming):
            out += [ir.BarrierWait(bar(full), phase, loc) for g, (full, _) in zip(groups, bars) if g.first == k]
            out.append(restage(s))
            out += [ir.BarrierArrive(bar(empty), loc) for g, (_, empty) in zip(groups, bars) if g.last == k]
        return tuple(out)

    def per_tile(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        return stmts if tile_loop is None else [dataclasses.replace(tile_loop, body=ir.Seq(tuple(stmts), loc))]

    new_allocs: list[ir.Alloc] = []
    pre = _preload(body[:plan.loop_index], plan.preloads, new_allocs, loc, tile_loop, consumers,
                   preload_slots)
    epilogue = ir.Seq(tuple(s for s in body[plan.loop_index + 1:] if not isinstance(s, ir.Alloc)), loc)
    if staging != "registers":
        epilogue = _staged(epilogue, new_allocs, kernel, share=staging == "shared")
    epilogue = list(epilogue.stmts)
    p_init, p_loop = role_loop("produced", produce)
    c_init, c_loop = role_loop("consumed", consume)
    slotted = {**rings, **pre.rings}
    allocs = [ir.Alloc(slotted.get(s.buffer, s.buffer), s.loc) for s in top if isinstance(s, ir.Alloc)]
    allocs += new_allocs + counters + [ir.Alloc(b, loc) for p in bars for b in p]
    once, each_tile = (pre.loads, []) if tile_loop is None else ([], pre.loads)
    producer = ir.Role((0,), ir.Seq(tuple(once + p_init + per_tile([*each_tile, p_loop])), loc), loc=loc)
    tile = [pre.restage(s) for s in (*pre.prelude, c_loop, *pre.release, *epilogue)]
    consumer = ir.Role(tuple(range(1, consumers + 1)), ir.Seq(tuple(c_init + per_tile(tile)), loc),
                       loc=loc)
    ws = ir.WarpSpecialize((producer, consumer), loc)
    out = dataclasses.replace(kernel, body=ir.Seq((*allocs, ws), kernel.body.loc),
                              threads=kernel.threads + 128)
    shape = "" if tile_loop is None else " over a persistent tile loop (one running ring count)"
    out = out.with_plan(dataclasses.replace(
        plan, preload_rings=tuple(b.name for b in pre.rings.values())))
    return out.with_note(f"warp_specialize: T.Pipelined at line {loc.line} -> producer "
                         f"{roles.describe(producer.warpgroups)} + "
                         f"consumer {roles.describe(consumer.warpgroups)}, {S}-stage ring of "
                         f"{', '.join(plan.ring_buffers)}{shape}")


@dataclasses.dataclass(frozen=True)
class _RingGroup:
    """Copies whose buffers the consumer first reads at statement ``first`` and last touches at
    ``last`` (indices into the consuming statements): they share one full/empty barrier pair."""
    copies: tuple
    first: int
    last: int


def _ring_groups(producers: list, consuming: list) -> list[_RingGroup]:
    """One group for all copies (a GEMM's A and B) when the consumer first reads them at one
    gemm, else one group per first gemm reader (attention's V after Q K^T). A copy first read by
    something else (block-wise FP8's row scales, read into registers just before the k-block's
    gemm) joins the group of the first gemm at or after that read: a barrier pair of its own
    would cost each iteration a wait and an arrival for nothing to overlap (H100, FP8 block-wise
    8192^3: one pair 1.04x faster than two). Consecutive gemm statements (the pieces
    split_extents made of one T.gemm: head dim 192's Q K^T over K 128 + 64) count as one
    reader, so the pieces of one tile share a pair. A group's wait goes right before its first reader
    and its release right after its last reader, so fragment math after the last reader (an FP8
    k-block's promotion) runs with the stage already released, Q K^T waits only for K, and a
    later schedule may keep P V of one block in flight across the next block's Q K^T
    (overlap_softmax)."""
    used = [touched(s) for s in consuming]
    gemms = [k for k, s in enumerate(consuming) if any(isinstance(t, ir.Gemm) for t in walk(s))]
    span = {}
    for p in producers:
        uses = [k for k, bufs in enumerate(used) if p.dst.buffer in bufs]
        if not uses:
            return [_RingGroup(tuple(producers), 0, len(consuming) - 1)]
        key = next((g for g in gemms if g >= uses[0]), uses[0])
        while key - 1 in gemms and all(isinstance(consuming[j], ir.Gemm) for j in (key - 1, key)):
            key -= 1
        span[id(p)] = (key, uses[0], uses[-1])
    keys = sorted({span[id(p)][0] for p in producers})
    groups = [[p for p in producers if span[id(p)][0] == key] for key in keys]
    return [_RingGroup(tuple(g), min(span[id(p)][1] for p in g), max(span[id(p)][2] for p in g))
            for g in groups]


@dataclasses.dataclass(frozen=True)
class _Preloads:
    """What ``_preload`` made: the consumer's statements before its loop (the wait in place of the
    first preload), the producer's loads, the consumer's release after its loop, the preloaded
    buffers' slotted replacements (persistent kernels with two slots) and ``restage``, which
    points the consumer's accesses of them at the tile's slot."""
    prelude: list
    loads: list
    release: list
    rings: dict
    restage: Callable[[ir.Stmt], ir.Stmt]


def _preload(before: tuple, positions: tuple[int, ...], new_allocs: list, loc: ir.Loc,
             tile_loop, consumers: int, slots: int) -> _Preloads:
    """The copies at ``positions`` move to the producer, completing on a ``preloaded`` barrier;
    the consumer waits for it where the first of them was. In a persistent kernel they are
    loaded per tile into slot ``t % slots`` (tile iteration ``t``; phase ``(t // slots) & 1``),
    once the consumer has released the slot's previous tile after its loop (a ``reloadable``
    barrier per slot, the producer's wait passing at once for each slot's first tile); the
    release is empty otherwise."""
    if not positions:
        return _Preloads([s for s in before if not isinstance(s, ir.Alloc)], [], [], {}, lambda s: s)
    c = lambda v: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    if tile_loop is None:
        slot, phase, slots = c(0), c(0), 1
    elif slots == 1:
        slot, phase = c(0), ir.BinOp(ir.BinOpKind.AND, schedule.iteration(tile_loop, loc), c(1),
                                     ir.DType.I32, loc)
    else:
        slot, phase = schedule.ring_slot(schedule.iteration(tile_loop, loc), slots, loc)
    rings = {} if slots == 1 else {
        before[k].dst.buffer: dataclasses.replace(before[k].dst.buffer,
                                                  shape=(c(slots),) + before[k].dst.buffer.shape)
        for k in positions}
    restage = schedule.restager(rings, slot) if rings else (lambda s: s)
    bar = ir.Buffer("preloaded", (c(slots),), ir.DType.I64, ir.Scope.BARRIER, (128,) * slots, loc)
    new_allocs.append(ir.Alloc(bar, loc))
    ref = ir.BarrierRef(bar, slot, loc)
    prelude: list[ir.Stmt] = []
    for k, s in enumerate(before):
        if k == positions[0]:
            prelude.append(ir.BarrierWait(ref, phase, s.loc))
        elif k not in positions and not isinstance(s, ir.Alloc):
            prelude.append(s)
    loads = [dataclasses.replace(restage(before[k]), barrier=ref) for k in positions] + [ir.BarrierArrive(ref, loc)]
    if tile_loop is None:
        return _Preloads(prelude, loads, [], rings, restage)
    free = ir.Buffer("reloadable", (c(slots),), ir.DType.I64, ir.Scope.BARRIER,
                     (128 * consumers,) * slots, loc)
    new_allocs.append(ir.Alloc(free, loc))
    free_ref = ir.BarrierRef(free, slot, loc)
    return _Preloads(prelude, [ir.BarrierWait(free_ref, schedule.flipped(phase, loc), loc)] + loads,
                     [ir.BarrierArrive(free_ref, loc)], rings, restage)


def _stage_epilogues(kernel: ir.Kernel) -> ir.Kernel:
    """Explicit programs: stage each role's fragment -> global copies through shared memory."""
    new_allocs: list[ir.Alloc] = []
    body = _staged(kernel.body, new_allocs, kernel)
    allocs = tuple(s for s in body.stmts if isinstance(s, ir.Alloc))
    rest = tuple(s for s in body.stmts if not isinstance(s, ir.Alloc))
    return dataclasses.replace(kernel, body=ir.Seq(allocs + tuple(new_allocs) + rest, body.loc))


def _staged(body: ir.Seq, new_allocs: list, kernel: ir.Kernel, share: bool = False) -> ir.Seq:
    """``body`` with each fragment -> global copy in it, inside loops and branches too, staged,
    except copies into a buffer the kernel also reads (a split-K partial another block sums). A
    bulk store is complete for its source's reads only (``cp.async.bulk.wait_group.read``, the
    one wait Gluon spells) and writes through the async proxy, so neither a release nor a
    barrier could make it visible to a later read in this kernel: those tiles are stored from
    registers, as are tiles of a tensor whose rows a bulk copy cannot address (not whole 16-byte
    units). With ``share`` (``body`` is one role's), copies of one tile shape and dtype share
    a staging buffer: each bulk store is waited for before its buffer is written again."""
    read = {b for s in walk(kernel.body) for b in buffers_read(s) if b.scope is ir.Scope.GLOBAL}
    shared: dict = {}

    def staging(s: ir.Copy) -> ir.Buffer:
        key = (s.src.tile_shape, s.dst.buffer.dtype) if share else id(s)
        if key not in shared:
            tile = s.src.tile_shape
            shared[key] = ir.Buffer(f"{s.src.buffer.name}_stage{len(new_allocs)}",
                                    tuple(ir.Const(d, ir.DType.I32, s.loc) for d in tile),
                                    s.dst.buffer.dtype, ir.Scope.SHARED, (), s.loc)
            new_allocs.append(ir.Alloc(shared[key], s.loc))
        return shared[key]

    def stage(s: ir.Stmt):
        if not (isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.FRAGMENT
                and s.dst.buffer.scope is ir.Scope.GLOBAL) or s.dst.buffer in read \
                or not bulk_copy_tensor(s.dst.buffer):
            return None
        buf = staging(s)
        whole = ir.Region(buf, tuple(ir.Const(0, ir.DType.I32, s.loc) for _ in s.src.tile_shape),
                          s.src.tile_shape, s.loc)
        return ir.Seq((dataclasses.replace(s, dst=whole), ir.ProxyFence(s.loc),
                       dataclasses.replace(s, src=whole)), s.loc)
    return rewrite(body, stage)
