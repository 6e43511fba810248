"""overlap_promotion: keep the tensor cores busy while a warp group promotes FP8 products — each
k-block's wgmma runs while the previous k-block's product is added into the running sum, the
products alternating between two fragments.

Requires:  legalize_wgmma made an ``AsyncPlan`` and ``config.policy.overlap_promotion`` is on
           (``TILEWS_OVERLAP_PROMOTION``; otherwise the pass does nothing).
Ensures:   a loop ``for k in serial(start, stop, step)`` of a role's body, with a positive
           constant step, a build-time trip count n >= 2 and the body

               H(k); barrier_wait R[i(k)]; gemm A, B -> X [wgmma, clear_accum]; gemm_wait 0;
               E(k); T(k)

           (``T.fp8_scaled_matmul``'s k-loop with per-tensor / per-row scales: E the arrivals
           releasing the ring slot, T the promotion of X into the accumulators), where the gemm's
           A is in shared memory, X is a fragment touched nowhere else in the role, R holds at
           least ``overlap_mma.MIN_STAGES`` barriers, H and T hold no gemm, gemm wait, barrier
           wait (nor H or T an arrival), T reads nothing H, the barrier wait or the gemm writes but
           X, and they read nothing T writes, becomes (``I(v)`` = H(v); barrier_wait R[i(v)];
           gemm -> X; primes: X replaced by its twin X_odd, a new fragment of X's layout;
           ``b_j = start + j * step``; U = ``UNROLL``; n - 1 = q * U + r):

               I'(b_0); gemm_wait 0
               for k in serial(b_1, b_1 + q * U * step, U * step):  RUN(k, U)
               RUN(b_1 + q * U * step, r)          # where r > 0
               E(b_n-1) T(b_n-1)                   # primed where r is even

           with RUN(f, c), the k-blocks f .. f + (c - 1) * step, the one before f complete in
           X_odd: ``E'(f - step); I(f); T'(f - step)``, then for j = 1 .. c - 1:
           ``I(f + j * step) [primed for odd j]; gemm_wait 1; E T(f + (j - 1) * step) [primed
           for even j]``, then ``gemm_wait 0``. Each k-block's gemm is issued before the previous
           one's promotion, which runs while it is in flight (wgmma groups complete in order:
           ``gemm_wait 1`` completes the previous k-block's); nothing is in flight at the back
           edge: ptxas serializes every wgmma of a loop that carries one in flight into a
           non-wgmma read of another's accumulator (C7514). The ring slot of the k-block held
           complete across the back edge is released before the next gemm is issued (the TTGIR
           verifier sees no wait between them). U = 2 because ptxas moves a promotion's adds below
           later gemms of the same parity, giving each its own registers: with U = 4, 64 x 128
           tiles spilled (1 KB) and their wgmmas serialized.
Preserves: program meaning (the interpreter runs gemms synchronously; I(v) and E T(v) each run in
           k-order, and T(v) after I(v + step) only where T reads nothing I writes but X, which
           alternates with X_odd) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, schedule
from ..config import BackendConfig
from ..plans import AsyncPlan, LayoutPlan
from ..simplify import fold
from ..traverse import footprint, fresh_name, touched, transform, walk
from .overlap_mma import MIN_STAGES

UNROLL = 2
"""k-blocks per iteration of the rewritten loop (even: its last is a twin's)."""
_SYNC = (ir.Gemm, ir.GemmWait, ir.BarrierWait)


@dataclasses.dataclass(frozen=True)
class _Form:
    """A matched loop: its head, issue (barrier wait, gemm), tail (its arrivals, then the rest)
    and trip count."""
    head: tuple
    issue: tuple
    releases: tuple
    promote: tuple
    trips: int


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if kernel.find_plan(AsyncPlan) is None or not config.policy.overlap_promotion:
        return kernel
    layouts = dict(kernel.plan(LayoutPlan).layouts)
    allocs: list[ir.Alloc] = []
    stmts = []
    for s in kernel.body.stmts:
        if isinstance(s, ir.WarpSpecialize):
            s = dataclasses.replace(s, roles=tuple(
                dataclasses.replace(r, body=_body(kernel, r.body, layouts, allocs)) for r in s.roles))
        stmts.append(s)
    if not allocs:
        return kernel
    plan = kernel.plan(LayoutPlan)
    return dataclasses.replace(kernel, body=ir.Seq(tuple(allocs) + tuple(stmts), kernel.body.loc)) \
        .with_plan(LayoutPlan(tuple(sorted(layouts.items())), plan.frames)) \
        .with_note(f"overlap_promotion: each k-block's gemm is issued before the previous one's "
                   f"product is promoted, the products in {', '.join(a.buffer.name for a in allocs)} "
                   f"and the fragments they twin by turns")


def _body(kernel: ir.Kernel, body: ir.Seq, layouts: dict, allocs: list) -> ir.Seq:
    out = []
    for s in body.stmts:
        form = _match(s, [t for t in body.stmts if t is not s]) if isinstance(s, ir.For) else None
        if form is None:
            out.append(s)
            continue
        x = form.issue[1].c.buffer
        twin = dataclasses.replace(x, name=fresh_name(kernel, f"{x.name}_odd"))
        allocs.append(ir.Alloc(twin, x.loc))
        layouts[twin.name] = layouts[x.name]
        out += _unrolled(s, form, x, twin)
    return dataclasses.replace(body, stmts=tuple(out))


def _match(loop: ir.For, others: list) -> Optional[_Form]:
    step = ir.as_int(loop.step)
    trips = ir.as_int(schedule.trip_count(loop, loop.loc))
    if loop.kind is ir.ForKind.PERSISTENT or not step or step <= 0 or trips is None or trips < 2:
        return None
    b = loop.body.stmts
    w = next((k for k, s in enumerate(b) if isinstance(s, ir.BarrierWait)), None)
    if w is None or w + 2 >= len(b):
        return None
    wait, gemm, gwait = b[w:w + 3]
    head, tail = b[:w], b[w + 3:]
    if not (isinstance(gemm, ir.Gemm) and gemm.instr is ir.GemmInstr.WGMMA and gemm.clear_accum
            and gemm.clear_if is None and gemm.a.buffer.scope is ir.Scope.SHARED
            and gemm.c.buffer.scope is ir.Scope.FRAGMENT
            and isinstance(gwait, ir.GemmWait) and gwait.outstanding == 0
            and len(wait.barrier.buffer.arrive_counts) >= MIN_STAGES and tail):
        return None
    if any(isinstance(t, _SYNC) for s in head + tail for t in walk(s)) \
            or any(isinstance(t, ir.BarrierArrive) for s in head for t in walk(s)):
        return None
    x = gemm.c.buffer
    i_reads, i_writes = footprint(*head, wait, gemm)
    t_reads, t_writes = footprint(*tail)
    if t_reads & (i_writes - {x}) or i_reads & t_writes or x in touched(*others):
        return None
    arrivals = next((j for j, s in enumerate(tail) if not isinstance(s, ir.BarrierArrive)), len(tail))
    if any(isinstance(t, ir.BarrierArrive) for s in tail[arrivals:] for t in walk(s)):
        return None
    return _Form(head, (wait, gemm), tail[:arrivals], tail[arrivals:], trips)


def _unrolled(loop: ir.For, form: _Form, x: ir.Buffer, twin: ir.Buffer) -> list:
    """The rewrite of the module docstring."""
    loc = loop.loc
    k, start, step = loop.var, loop.start, ir.as_int(loop.step)
    i32 = ir.DType.I32

    def plus(e: ir.Expr, j: int) -> ir.Expr:
        return fold(ir.BinOp(ir.BinOpKind.ADD, e, ir.Const(j * step, i32, loc), i32, loc))

    def parity(stmts, odd: bool) -> tuple:
        if not odd:
            return stmts
        return tuple(transform(s, lambda n: twin if n == x else None) for s in stmts)

    def issue(v, odd: bool) -> tuple:
        return parity(schedule.substitute(form.head + form.issue, k, v), odd)

    def finish(v, odd: bool, part: tuple) -> tuple:
        return parity(schedule.substitute(part, k, v), odd)

    gemm_loc = form.issue[1].loc

    def run(first: ir.Expr, count: int) -> list:
        """k-blocks first .. first + count - 1, the one before held complete in the twins (its
        slot released before the first gemm is issued, its promotion under that gemm)."""
        held = plus(first, -1)
        out = [*finish(held, True, form.releases), *issue(first, False),
               *finish(held, True, form.promote)]
        for j in range(1, count):
            out += [*issue(plus(first, j), j % 2 == 1), ir.GemmWait(1, gemm_loc),
                    *finish(plus(first, j - 1), j % 2 == 0, form.releases + form.promote)]
        return out + [ir.GemmWait(0, gemm_loc)]

    n = form.trips
    rounds, left = divmod(n - 1, UNROLL)
    out = [*issue(start, True), ir.GemmWait(0, gemm_loc)]
    if rounds:
        first = plus(start, 1)
        out.append(dataclasses.replace(loop, start=first, stop=plus(first, rounds * UNROLL),
                                       step=ir.Const(UNROLL * step, i32, loc),
                                       body=ir.Seq(tuple(run(k, UNROLL)), loop.body.loc)))
    if left:
        out += run(plus(start, 1 + rounds * UNROLL), left)
    return out + list(finish(plus(start, n - 1), left % 2 == 0, form.releases + form.promote))
