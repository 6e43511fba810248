"""pingpong: the consumer warp groups take turns on the tensor cores — FlashAttention-3's
ping-pong between warp groups.

Split consumers (split_consumers) only meet at the producer's barriers: nothing stops them from
issuing their gemms together and then running their fragment math together while the tensor
cores idle. Taking turns to issue puts one warp group's gemms on the tensor cores while the
others run their softmax.

Requires:  overlap_softmax has run (the issue order within each role is final); applies on
           targets with ``pingpong`` to kernels with a ``ConsumerSplit`` of n >= 2 roles, each of
           which issues wgmma gemms.
Ensures:   a barrier buffer ``turns`` of n mbarriers, each completed by one role's arrival, and
           per split role h (0-based, in ``ConsumerSplit`` order) a scalar local ``turns_h`` set
           to 0 at the top of the role. In role h every *issue* — a maximal run of barrier waits
           and wgmma gemms in one statement list, holding a gemm — becomes

               <its waits before the first gemm>
               barrier_wait turns[h] parity=(turns_h & 1) ^ (h == 0)
               <the rest of the run up to its last gemm>
               barrier_arrive turns[(h + 1) % n]; turns_h = turns_h + 1
               <its waits after the last gemm>

           The roles are copies of one body, so each runs the same issues in the same order: role
           h's c-th issue waits for role h - 1's c-th (role 0's for role n - 1's (c - 1)-th; a fresh
           barrier passes parity 1, so role 0 goes first) and the issues run ws(1), ws(2), ...,
           ws(n), ws(1), ... The ``AsyncPlan`` counts the new barriers and scalars, the
           ``SharedMemoryPlan`` places the barriers after the last range; where that exceeds
           ``config.caps.smem_bytes`` the kernel is unchanged, with a note.
Preserves: program meaning (interpreter before == after) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir, protocol, roles, schedule
from ..plans import AsyncPlan, ConsumerSplit, SharedMemoryPlan
from ..config import BackendConfig
from ..traverse import fresh_name, transform, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    split = kernel.find_plan(ConsumerSplit)
    plan = kernel.find_plan(AsyncPlan)
    if not config.policy.pingpong or split is None or plan is None or len(split.roles) < 2:
        return kernel
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    by_groups = {r.warpgroups: r for r in ws.roles}
    if not all(any(_issues_gemm(t) for t in walk(by_groups[g].body)) for g in split.roles):
        return kernel
    loc = ws.loc
    n = len(split.roles)
    threads = roles.role_threads(split.roles[0])
    turns = ir.Buffer(fresh_name(kernel, "turns"), (_const(n, loc),), ir.DType.I64, ir.Scope.BARRIER,
                      (threads,) * n, loc)
    shared = kernel.plan(SharedMemoryPlan).placed(turns.name, 8 * n, 8)
    if shared.total_bytes > config.caps.smem_bytes:
        return kernel.with_note(f"pingpong: no room for {n} more mbarriers in shared memory; the "
                                f"consumer warp groups issue their gemms without taking turns")
    counters, replaced = [], {}
    for h, groups in enumerate(split.roles):
        count = ir.Buffer(fresh_name(kernel, f"turns_{h}"), (_const(1, loc),), ir.DType.I32,
                          ir.Scope.LOCAL, (), loc)
        counters.append(count)
        role = by_groups[groups]
        body = _take_turns(role.body, turns, count, h, n)
        start = ir.Store(count, (_const(0, loc),), _const(0, loc), loc)
        replaced[groups] = dataclasses.replace(role, body=dataclasses.replace(body, stmts=(start,) + body.stmts))
    ws2 = dataclasses.replace(ws, roles=tuple(replaced.get(r.warpgroups, r) for r in ws.roles))
    allocs = tuple(ir.Alloc(b, loc) for b in (turns, *counters))
    at = kernel.body.stmts.index(ws)
    body = kernel.body.stmts[:at] + allocs + (ws2,) + kernel.body.stmts[at + 1:]
    arrivals = protocol.phase_arrivals(turns, split.roles)
    plan = dataclasses.replace(plan, barrier_counts=plan.barrier_counts + ((turns.name, arrivals),),
                               scalar_locals=plan.scalar_locals + tuple((c.name, True) for c in counters))
    names = ", ".join(roles.describe(g) for g in split.roles)
    return dataclasses.replace(kernel, body=ir.Seq(body, kernel.body.loc)).with_plan(plan).with_plan(
        shared).with_note(f"pingpong: {names} take turns issuing their gemms (mbarriers '{turns.name}'), "
                          f"so one's fragment math runs under another's gemms")


def _const(v: int, loc: ir.Loc) -> ir.Const:
    return ir.Const(v, ir.DType.I32, loc)


def _issues_gemm(s: ir.Stmt) -> bool:
    return isinstance(s, ir.Gemm) and s.instr is ir.GemmInstr.WGMMA


def _take_turns(body: ir.Seq, turns: ir.Buffer, count: ir.Buffer, h: int, n: int) -> ir.Seq:
    """Every issue of ``body`` (module docstring) bracketed by role ``h``'s turn (``transform``
    works bottom-up: nested statement lists are done when their parent's turn comes)."""
    def fn(node):
        if not isinstance(node, ir.Seq) or not any(_issues_gemm(s) for s in node.stmts):
            return None
        out, run = [], []
        for s in node.stmts + (None,):
            if s is not None and (isinstance(s, ir.BarrierWait) or _issues_gemm(s)):
                run.append(s)
                continue
            out += _turn(run, turns, count, h, n) if any(_issues_gemm(t) for t in run) else run
            run = []
            if s is not None:
                out.append(s)
        return dataclasses.replace(node, stmts=tuple(out))
    return transform(body, fn)


def _turn(run: list, turns: ir.Buffer, count: ir.Buffer, h: int, n: int) -> list:
    first = next(k for k, s in enumerate(run) if _issues_gemm(s))
    last = max(k for k, s in enumerate(run) if _issues_gemm(s))
    loc = run[first].loc
    i32 = ir.DType.I32
    taken = ir.Load(count, (_const(0, loc),), loc)
    parity = ir.BinOp(ir.BinOpKind.AND, taken, _const(1, loc), i32, loc)
    if h == 0:
        parity = schedule.flipped(parity, loc)
    wait = ir.BarrierWait(ir.BarrierRef(turns, _const(h, loc), loc), parity, loc)
    arrive = ir.BarrierArrive(ir.BarrierRef(turns, _const((h + 1) % n, loc), loc), run[last].loc)
    bump = ir.Store(count, (_const(0, loc),), ir.BinOp(ir.BinOpKind.ADD, taken, _const(1, loc), i32, loc),
                    run[last].loc)
    return run[:first] + [wait] + run[first:last + 1] + [arrive, bump] + run[last + 1:]
