"""ring_handshakes: an explicit ``T.ws`` loop that hands one set of shared buffers back and forth
through a single pair of barriers becomes a ring, so the producer loads ahead of the consumer.

Requires:  the source form of an explicit program (``Role`` blocks inside its loops), as
           ``check_barriers`` checked it; before ``warp_specialize``.
Ensures:   a serial loop among the kernel's top-level statements whose body is the blocks of two
           roles, a producer P and a consumer C, that run per iteration ``i`` (0-based)

               P: wait(E, parity (i + 1) % 2); copies/gemms writing shared tiles X; arrive(F)
               C: wait(F, parity i % 2);       copies/gemms reading X;              arrive(E)

           (TileLang's ``data_is_ready`` / ``compute_is_done`` examples, ``examples/ws_gemm.py``),
           where F and E are single barriers that one arrival of P (F) or of C (E) completes and
           that nothing outside the loop uses, X are the shared buffers P writes in the loop,
           which nothing outside the loop touches and which are touched in it only by copies and
           gemms, P writes nothing else than X and its own registers, C no shared or global
           memory, and the parities are those above at every iteration (evaluated over a period
           of the loop's barrier behaviour, ``protocol.period``): a handshake of one slot, in
           which P fills X for iteration i only after C has released iteration i - 1 and C reads
           it only after P has filled it, so P and C take turns and loads never overlap the
           consumer's gemms. It becomes a ring of S slots: each buffer in X gets a leading slot
           dimension and every access in the loop reads or writes slot ``i % S``; F and E become
           S barriers each (the same arrive counts), indexed by that slot; C waits ``F[i % S]``
           with parity ``(i // S) & 1`` and P ``E[i % S]`` with parity ``((i // S) & 1) ^ 1``
           (warp_specialize's ring: P runs up to S iterations ahead). S is the deepest of
           ``RING_STAGES`` down to 2 (at most the trip count, where it is known) whose form fits
           ``config.caps.smem_bytes`` after the passes up to plan_buffers (``peak_after``), and
           only where ``check_barriers`` shows the ringed roles all finish (``unproven``). A note
           on the kernel says which buffers became a ring of how many slots; a loop of that form
           left as written (no depth fits, or the check cannot show it) gets a note saying why.
           Anything else: unchanged.
Preserves: program meaning: in both forms C's iteration i reads exactly what P's iteration i
           wrote (the single slot: P's next write waits for C's release; the ring: slot i % S is
           written again only at iteration i + S, after C released it at iteration i), and no
           other statement or role touches X, F or E; so no result the interpreter can observe
           changes, under any schedule (tests/passes/test_ring_handshakes.py runs both). Locations.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from .. import ir, protocol, roles, schedule
from ..config import BackendConfig
from ..simplify import evaluate, fold
from ..traverse import buffers_written, touched, transform, walk
from . import check_barriers, plan_buffers

RING_STAGES = 4
"""The deepest ring a handshake becomes: with three or more slots ``overlap_mma`` keeps each
wgmma in flight while the producer still leads by a slot, and a fourth gives the loads more
lead (a hand-written Gluon GEMM of one 1-warp producer and one consumer warp group at
128x128x64 in 4 stages reached 0.83-0.85x cuBLAS, docs/performance.md; the one-slot form of
TileLang's examples, 0.35x). Deeper rings that shared memory holds buy no more there."""


@dataclass(frozen=True)
class Handshake:
    loop: ir.For
    buffers: tuple          # X: the shared buffers handed over, in allocation order
    full: ir.Buffer         # F: the producer arrives, the consumer waits
    empty: ir.Buffer        # E: the consumer arrives, the producer waits


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if not roles.role_sets(kernel.body):
        return kernel
    for loop in [s for s in kernel.body.stmts if isinstance(s, ir.For)]:
        found = handshake(kernel, loop)
        if found is not None:
            kernel = _promoted(kernel, found, config)
    return kernel


def _promoted(kernel: ir.Kernel, hs: Handshake, config: BackendConfig) -> ir.Kernel:
    """``kernel`` with the handshake ``hs`` as the deepest ring that fits and is shown to finish,
    with a note either way."""
    trips = protocol.loop_range(hs.loop, {})[2]
    names = ", ".join(b.name for b in hs.buffers)
    what = (f"ring_handshakes: the loop at line {hs.loop.loc.line} hands {names} over through "
            f"the single barriers '{hs.full.name}' and '{hs.empty.name}'")
    need = None
    for stages in range(min(RING_STAGES, trips if trips is not None else RING_STAGES), 1, -1):
        ring = ringed(kernel, hs, stages)
        need = plan_buffers.peak_after("ring_handshakes", ring, config)
        if need > config.caps.smem_bytes:
            continue
        unproven = check_barriers.unproven(ring, config)
        if unproven is not None:
            return kernel.with_note(f"{what}; kept as written: the protocol check cannot show "
                                    f"that a ring of {stages} slots finishes: {unproven}")
        return ring.with_note(
            f"{what}, one slot the producer fills only after the consumer released it: now a "
            f"ring of {stages} slots, the producer up to {stages} iterations ahead (the consumer "
            f"still reads each iteration's tiles after the producer wrote them, nothing else "
            f"touches them, and the protocol check shows the ringed roles finish; {need} bytes "
            f"of shared memory)")
    if need is None:
        return kernel
    return kernel.with_note(f"{what}; kept as written: 2 slots would need {need} bytes of shared "
                            f"memory, more than the {config.caps.smem_bytes} of target "
                            f"'{config.name}'")


# ----------------------------------------------------------------------------------------------
# recognizing the handshake


def handshake(kernel: ir.Kernel, loop: ir.For) -> Optional[Handshake]:
    """The handshake of ``loop`` (see the contract), or None."""
    if loop.kind is not ir.ForKind.SERIAL \
            or not all(isinstance(s, ir.Role) for s in loop.body.stmts):
        return None
    bodies: dict[tuple, list] = {}
    for r in loop.body.stmts:
        bodies.setdefault(r.warpgroups, []).extend(r.body.stmts)
    if len(bodies) != 2:
        return None
    framed = {wg: _framed(stmts) for wg, stmts in bodies.items()}
    if None in framed.values():
        return None
    # the producer is the role writing shared memory (where both do, the consumer check refuses)
    (producer, (p_wait, p_mid, p_arrive)), (consumer, (c_wait, c_mid, c_arrive)) = sorted(
        framed.items(), key=lambda role: not _shared_writes(role[1][1]))
    full, empty = p_arrive.barrier.buffer, c_arrive.barrier.buffer
    if (c_wait.barrier.buffer != full or p_wait.barrier.buffer != empty or full == empty
            or full.arrive_counts != (roles.role_threads(producer),)
            or empty.arrive_counts != (roles.role_threads(consumer),)):
        return None
    ring = _shared_writes(p_mid)
    if not ring or not _writes_only(p_mid, ring) or not _writes_only(c_mid, set()):
        return None
    if any(ring & touched(s) and not isinstance(s, (ir.Copy, ir.Gemm))
           for s in (*p_mid, *c_mid)):
        return None
    if _completing(p_mid) - {full} or _completing(c_mid):
        return None
    if not _alone(kernel, loop, ring | {full, empty}) or not _parities(loop, p_wait, c_wait):
        return None
    order = [s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)]
    return Handshake(loop, tuple(b for b in order if b in ring), full, empty)


def _framed(stmts: list):
    """(wait, the statements between, arrive) where ``stmts`` is a wait on one barrier, statements
    without barrier operations, and an arrival on one barrier; else None."""
    if len(stmts) < 3 or not isinstance(stmts[0], ir.BarrierWait) \
            or not isinstance(stmts[-1], ir.BarrierArrive):
        return None
    mid = stmts[1:-1]
    if any(protocol.syncs_in(s) or any(isinstance(t, ir.Role) for t in walk(s)) for s in mid):
        return None
    ends = (stmts[0].barrier, stmts[-1].barrier)
    if any(len(b.buffer.arrive_counts) != 1 or evaluate(b.index) != 0 for b in ends):
        return None
    return stmts[0], mid, stmts[-1]


def _shared_writes(stmts) -> set:
    return {b for s in stmts for t in walk(s) for b in buffers_written(t)
            if b.scope is ir.Scope.SHARED}


def _completing(stmts) -> set:
    """The barriers the asynchronous copies in ``stmts`` complete on."""
    return {t.barrier.buffer for s in stmts for t in walk(s)
            if isinstance(t, ir.Copy) and t.barrier is not None}


def _writes_only(stmts, shared: set) -> bool:
    """Whether ``stmts`` write nothing but ``shared`` and their role's own registers."""
    own = (ir.Scope.FRAGMENT, ir.Scope.LOCAL)
    return all(b in shared or b.scope in own
               for s in stmts for t in walk(s) for b in buffers_written(t))


def _alone(kernel: ir.Kernel, loop: ir.For, buffers: set) -> bool:
    """Whether nothing in ``kernel`` outside ``loop`` uses ``buffers``, all allocated at its top
    level (a barrier: no wait, arrival or copy completing on it)."""
    top = {s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)}
    if not buffers <= top:
        return False
    for s in kernel.body.stmts:
        if s is loop or isinstance(s, ir.Alloc):
            continue
        for t in walk(s):
            bar = getattr(t, "barrier", None)
            if touched(t) & buffers or (bar is not None and bar.buffer in buffers):
                return False
    return True


def _parities(loop: ir.For, p_wait: ir.BarrierWait, c_wait: ir.BarrierWait) -> bool:
    """Whether at every iteration i the producer waits for parity (i + 1) % 2 and the consumer
    for i % 2: over one period of the loop's barrier behaviour, as the wait expressions repeat."""
    start, step, _ = protocol.loop_range(loop, {})
    period = protocol.period(loop, step) if start is not None and step else None
    if period is None:
        return False
    for i in range(math.lcm(period, 2)):
        env = {loop.var: start + i * step}
        p, c = evaluate(p_wait.parity, env), evaluate(c_wait.parity, env)
        if p is None or c is None or (int(p) & 1, int(c) & 1) != ((i + 1) & 1, i & 1):
            return False
    return True


# ----------------------------------------------------------------------------------------------
# the ring


def ringed(kernel: ir.Kernel, hs: Handshake, stages: int) -> ir.Kernel:
    """``kernel`` with the handshake ``hs`` as a ring of ``stages`` slots (the contract's form)."""
    loc = hs.loop.loc
    slots = ir.Const(stages, ir.DType.I32, loc)
    slot, phase = schedule.ring_slot(fold(schedule.iteration(hs.loop, loc)), stages, loc)
    rings = {b: dataclasses.replace(b, shape=(slots,) + b.shape) for b in hs.buffers}
    bars = {b: dataclasses.replace(b, shape=(slots,), arrive_counts=b.arrive_counts * stages)
            for b in (hs.full, hs.empty)}
    parity = {bars[hs.full]: phase, bars[hs.empty]: schedule.flipped(phase, loc)}

    def fn(node):
        if isinstance(node, ir.BarrierRef) and node.buffer in bars:
            return ir.BarrierRef(bars[node.buffer], slot, node.loc)
        if isinstance(node, ir.BarrierWait) and node.barrier.buffer in parity:
            return dataclasses.replace(node, parity=parity[node.barrier.buffer])
        return schedule.in_slot(node, rings, slot)

    renamed = {**rings, **bars}
    stmts = tuple(ir.Alloc(renamed[s.buffer], s.loc)
                  if isinstance(s, ir.Alloc) and s.buffer in renamed
                  else transform(s, fn) if s is hs.loop else s
                  for s in kernel.body.stmts)
    return dataclasses.replace(kernel, body=dataclasses.replace(kernel.body, stmts=stmts))
