"""The mbarrier protocol, abstractly: what the checks of it and the interpreter share.

Contract:
* An mbarrier is (completed phases, threads arrived in the current phase). ``arrive`` adds
  arriving threads (a phase completes at the barrier's arrive count; arrivals beyond it spill into
  the next phase); ``passes(phase, parity)``: a wait on ``parity`` passes while the current
  phase's parity differs, i.e. once the phase of that parity has completed (a fresh barrier
  passes parity 1).
* ``barrier_at(ref, index, loc)``: the key ``(buffer name, index)`` and arrive count of one
  mbarrier, or a ``CompileError`` at ``loc`` for an index outside the buffer.
* ``syncs_in(s)``: whether ``s`` holds barrier operations; ``sync_exprs(s)``: (expression,
  statement) for every expression deciding what they do (barrier indices, wait parities, the
  conditions and loop bounds around them); ``period(loop, step)``: iterations after which the
  barrier behaviour of the loop's body repeats (None if not evident); ``loop_range(loop, env)``:
  (start, step, trip count), each None where it depends on a value ``env`` does not give;
  ``operands(e)``: an expression's direct subexpressions.
* ``arriving_roles(body)``: per barrier buffer, the warp-group sets of the roles that arrive on
  it (in order of first arrival); ``phase_arrivals(buffer, arriving)``: each count translated
  into arriving roles (a Hopper arrive is one per role), or a ``CompileError`` at the barrier's
  allocation when no set of whole arriving roles completes a phase.
* ``deadlock_report``, ``wait_text``, ``barrier_state``: the words of a deadlock report, shared by
  the interpreter (``DeadlockError`` at run time) and ``check_barriers`` (at compile time).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional, Sequence

from . import ir, roles
from .errors import CompileError
from .simplify import evaluate
from .traverse import subexprs, walk

Key = tuple  # (barrier buffer name, index)


# ----------------------------------------------------------------------------------------------
# one mbarrier


def arrive(phase: int, arrived: int, threads: int, count: int) -> tuple[int, int]:
    """(phase, arrived) after ``threads`` more threads arrive on a barrier counting ``count``."""
    arrived += threads
    return phase + arrived // count, arrived % count


def passes(phase: int, parity: int) -> bool:
    return (phase & 1) != (parity & 1)


def barrier_at(ref: ir.BarrierRef, index: int, loc: ir.Loc) -> tuple[Key, int]:
    counts = ref.buffer.arrive_counts
    if not 0 <= index < len(counts):
        raise CompileError(f"barrier index {index} is out of range for '{ref.buffer.name}' "
                           f"({len(counts)} barriers)", loc)
    return (ref.buffer.name, index), counts[index]


# ----------------------------------------------------------------------------------------------
# which expressions decide the barrier operations, and how loop indices enter them


def syncs_in(s: ir.Stmt) -> bool:
    return any(isinstance(t, (ir.BarrierArrive, ir.BarrierWait)) for t in walk(s))


def sync_exprs(s: ir.Stmt) -> Iterator[tuple[ir.Expr, ir.Stmt]]:
    """The expressions that decide what the barrier operations in ``s`` do, with their statement."""
    for t in walk(s):
        if isinstance(t, (ir.BarrierArrive, ir.BarrierWait)):
            yield t.barrier.index, t
        if isinstance(t, ir.BarrierWait):
            yield t.parity, t
        if isinstance(t, ir.If) and syncs_in(t):
            yield t.cond, t
        if isinstance(t, ir.For) and syncs_in(t.body):
            yield from ((e, t) for e in (t.start, t.stop, t.step))


def loop_range(loop: ir.For, env: dict) -> tuple[Optional[int], Optional[int], Optional[int]]:
    start, stop, step = (evaluate(x, env) for x in (loop.start, loop.stop, loop.step))
    trip = None
    if None not in (start, stop, step) and step != 0:
        trip = max(0, -(-(stop - start) // step))
    return start, step, trip


def period(loop: ir.For, step: Optional[int]) -> Optional[int]:
    """Iterations after which the barrier behaviour of ``loop``'s body repeats, or None."""
    p = 1
    for e, _ in sync_exprs(loop.body):
        sh = _shift(e, loop.var)
        if sh is None or sh[1] != 0:
            return None
        if sh[0] > 1:
            if step is None:
                return None
            p = math.lcm(p, sh[0] // math.gcd(sh[0], step))
    return p


def _shift(e: ir.Expr, v: ir.Var) -> Optional[tuple[int, int]]:
    """(P, d) with e(v + P) == e(v) + d for every v, or None if no such shift is evident."""
    if v not in set(subexprs(e)):
        return 1, 0
    if e == v:
        return 1, 1
    if isinstance(e, ir.BinOp) and e.op in (ir.BinOpKind.ADD, ir.BinOpKind.SUB):
        a, b = _shift(e.a, v), _shift(e.b, v)
        if a is None or b is None:
            return None
        p = math.lcm(a[0], b[0])
        sign = 1 if e.op is ir.BinOpKind.ADD else -1
        return p, a[1] * (p // a[0]) + sign * b[1] * (p // b[0])
    if isinstance(e, ir.BinOp) and e.op is ir.BinOpKind.MUL and ir.as_int(e.a) is not None:
        e = dataclasses.replace(e, a=e.b, b=e.a)
    k = ir.as_int(e.b) if isinstance(e, ir.BinOp) else None
    a = _shift(e.a, v) if isinstance(e, (ir.BinOp, ir.UnOp)) else None
    if isinstance(e, ir.UnOp) and e.op is ir.UnOpKind.NEG and a is not None:
        return a[0], -a[1]
    if k is not None and a is not None:
        p, d = a
        if e.op is ir.BinOpKind.MUL:
            return p, d * k
        if e.op is ir.BinOpKind.FLOORDIV and k > 0:
            m = k // math.gcd(d, k)
            return p * m, d * m // k
        modulus = k if e.op is ir.BinOpKind.MOD else k + 1 if (
            e.op is ir.BinOpKind.AND and k >= 0 and k & (k + 1) == 0) else 0
        if modulus > 0:
            return p * (modulus // math.gcd(d, modulus)), 0
    parts = [_shift(x, v) for x in operands(e)]
    if not parts or any(x is None or x[1] != 0 for x in parts):
        return None
    return math.lcm(*(x[0] for x in parts)), 0


def operands(e: ir.Expr) -> tuple:
    """The direct subexpressions of ``e`` (a ``Load``'s indices excluded)."""
    if isinstance(e, (ir.BinOp, ir.Cmp)):
        return e.a, e.b
    if isinstance(e, (ir.UnOp,)):
        return (e.a,)
    if isinstance(e, (ir.Cast, ir.Bitcast)):
        return (e.value,)
    if isinstance(e, ir.Select):
        return e.cond, e.a, e.b
    if isinstance(e, ir.Call):
        return e.args
    return ()


# ----------------------------------------------------------------------------------------------
# who arrives, and how many arrivals complete a phase


def arriving_roles(body: ir.Stmt) -> dict[str, list[tuple[int, ...]]]:
    out: dict[str, list[tuple[int, ...]]] = {}
    for r in walk(body):
        if isinstance(r, ir.Role):
            for t in walk(r.body):
                if isinstance(t, ir.BarrierArrive):
                    found = out.setdefault(t.barrier.buffer.name, [])
                    if r.warpgroups not in found:
                        found.append(r.warpgroups)
    return out


def phase_arrivals(b: ir.Buffer, arriving: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Arrivals per phase of each barrier in ``b`` when each arriving role arrives once (the IR
    counts threads): every arriving role once (the count is their threads together), or any
    ``n`` of equally sized roles (the count is ``n`` times their size, e.g. ping-pong consumers
    taking turns)."""
    total = sum(roles.role_threads(w) for w in arriving)
    sizes = {roles.role_threads(w) for w in arriving}
    out = []
    for count in b.arrive_counts:
        if count == total:
            out.append(len(arriving))
        elif len(sizes) == 1 and count % min(sizes) == 0:
            out.append(count // min(sizes))
        else:
            raise CompileError(
                f"barrier '{b.name}' counts {count} arriving threads, but the roles arriving on it "
                f"({', '.join(roles.describe(w) for w in sorted(arriving)) or 'none'}) cannot complete "
                f"a phase with exactly that many; on Hopper each phase must be completed by whole roles",
                b.loc)
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# how a deadlock is reported


def deadlock_report(where: str, blocked: Sequence[tuple[str, Optional[str]]]) -> str:
    """``blocked``: (role, what it waits for — ``wait_text`` — or None once it has finished)."""
    lines = [f"deadlock in {where}: every unfinished role is blocked on a barrier and no "
             f"asynchronous copy is in flight"]
    lines += [f"  {name}: " + ("finished" if wait is None else wait) for name, wait in blocked]
    return "\n".join(lines)


def wait_text(loc: ir.Loc, parity: int, name: str, index: int, state: str) -> str:
    return f"{loc}: waits for the phase of parity {parity} of barrier '{name}'[{index}]; {state}"


def barrier_state(name: str, index: int, phase: int, pending: int, count: int, tx: int) -> str:
    return (f"'{name}'[{index}] is in phase {phase} (parity {phase & 1}) with {pending} of {count} "
            f"arrivals and {tx} transaction bytes outstanding")
