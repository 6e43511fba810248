"""check_barriers: refuse, at compile time, a warp-specialized program whose barriers deadlock.
In the pipelines of backends where a deadlock hangs the machine (gluon); the interpreter
(``interpret``) reports a deadlock at run time instead, under the schedule that shows it.

Requires:  the roles as the user wrote them: the source form (``Role`` blocks inside the program;
           no pass before it rewrites roles). A split form (one
           ``WarpSpecialize``) is read the same way (``roles.streams``).
Ensures:   for a program with barrier operations:
           * with roles, each barrier's arrive count is one whole arriving roles can complete
             (``protocol.phase_arrivals``, the rule Hopper's translation applies), else
             ``CompileError`` at the barrier's allocation;
           * the roles, run concurrently on abstract barriers, all finish; else ``CompileError``
             at the first blocked wait, in the words of the interpreter's ``DeadlockError``: for
             every role, ``finished`` or its blocked wait (line, barrier, parity, barrier state);
           * where the protocol depends on what the check cannot follow (below), a note saying
             that it was not checked, why, and where.
Preserves: the kernel (a check: returned as is, at most with a note).

Why on the program as written, before warp_specialize: errors then name the user's statements
at their lines, and the roles are the user's; the later passes preserve the protocol (their
contracts, and tests/test_ws_oracle.py runs before and after under random schedules), while the
barriers warp_specialize creates for automatic programs are correct by construction and, in
guarded loops, advance by runtime counters (docs/ws-semantics.md #8) no static simulation follows.

The model (``lowering/protocol.py``, shared with despecialize). Each role is a stream of barrier
operations: an arrive adds the role's threads (128 per warp group; a program without roles is one
stream of the kernel's threads); a wait on parity p passes once the phase of parity p has
completed. An asynchronous copy lands at a later point of every schedule and landing it at once
is one of them, so its transaction bytes never keep a phase open: copies are not simulated.
Loops run iteration by iteration, branches take the side their condition picks. The scheduler
runs the roles round robin, one barrier operation per turn, so a wait that becomes passable
passes before the barrier can complete its next phase; when every unfinished role is blocked,
that is a deadlock (on the machine: a hang).

Values known only at run time. Barrier indices, parities, branch conditions and loop bounds are
evaluated with ``simplify.evaluate``. Where they depend on block indices of a static grid, every
block is checked (exact; blocks giving the same values to the loop-invariant run-time parts of
these expressions are simulated once). Where loop bounds depend on one runtime scalar
(``T.dynamic``), the trip counts are unrolled boundedly: the scalar takes the values 0, 1, ...
until the bounds have taken 2P + 2 distinct values, P being the period of the loops' barrier
behaviour (``protocol.period``), so every trip count modulo P is checked both while the pipeline
fills and after a whole period of steady state; this is exact for protocols whose roles stay less
than P iterations apart (a ring of S stages has P = 2S and lets the producer run S ahead).
Anything else — an index, parity or condition depending on a runtime scalar or on memory (e.g.
counters in local buffers), loop bounds depending on several runtime scalars, a loop whose
barrier behaviour does not repeat, more work than the limits below — leaves the program unchecked,
with the note.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Optional

from .. import ir, protocol, roles
from ..errors import CompileError
from ..simplify import evaluate
from ..config import BackendConfig
from ..traverse import subexprs, walk

MAX_OPERATIONS = 1 << 20   # barrier operations simulated, over all cases
MAX_CASES = 256            # distinct assignments of the run-time values simulated
MAX_BLOCKS = 1 << 16       # blocks enumerated
MAX_SCALAR = 1 << 14       # values a runtime scalar is tried with


class _Unchecked(Exception):
    def __init__(self, why: str, loc: ir.Loc):
        super().__init__(why)
        self.why = why
        self.loc = loc


@dataclass(frozen=True)
class _Op:
    stmt: ir.Stmt
    key: protocol.Key
    count: int
    parity: Optional[int]       # None: an arrive


@dataclass
class _Task:
    name: str
    threads: int
    ops: Iterator[_Op]
    waiting: Optional[_Op] = None
    done: bool = False


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if not protocol.syncs_in(kernel.body):
        return kernel
    if roles.role_sets(kernel.body):
        arriving = protocol.arriving_roles(kernel.body)
        for s in walk(kernel.body):
            if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER:
                protocol.phase_arrivals(s.buffer, arriving.get(s.buffer.name, ()))
    try:
        _Check(kernel, config).run()
    except _Unchecked as e:
        return kernel.with_note(f"check_barriers: the barrier protocol is not checked for deadlocks "
                                f"on target '{config.name}': {e.why} (line {e.loc.line})")
    return kernel


def unproven(kernel: ir.Kernel, config: BackendConfig) -> Optional[str]:
    """None where the check shows that the roles of ``kernel`` all finish (for passes that
    rewrite a protocol: ``ring_handshakes``); else why not, in words: the deadlock, or what the
    check cannot follow."""
    try:
        _Check(kernel, config).run()
    except _Unchecked as e:
        return f"{e.why} (line {e.loc.line})"
    except CompileError as e:
        return e.message
    return None


class _Check:
    def __init__(self, kernel: ir.Kernel, config: BackendConfig):
        self.kernel = kernel
        self.config = config
        self.streams = roles.streams(kernel)[1]
        self.budget = MAX_OPERATIONS
        self._syncs: dict[int, bool] = {}

    def run(self) -> None:
        for where, env in self._cases():
            self._simulate(where, env)

    # -- the run-time values: which assignments to simulate ---------------------------------------
    def _cases(self) -> Iterator[tuple[str, dict]]:
        loops = {t.var for _, _, body in self.streams for t in walk(body) if isinstance(t, ir.For)}
        extents = [evaluate(g) for g in self.kernel.grid]
        blocks = set(self.kernel.block_vars) if None not in extents else set()
        parts: list[ir.Expr] = []
        free: list[ir.Var] = []
        bounded: list[ir.For] = []          # loops whose bounds depend on a runtime scalar
        for _, _, body in self.streams:
            for e, t in protocol.sync_exprs(body):
                if any(isinstance(x, ir.Load) for x in subexprs(e)):
                    raise _Unchecked(f"{_what(t)} reads memory", t.loc)
                for p in _runtime_parts(e, loops):
                    parts.append(p)
                    for v in (x for x in subexprs(p) if isinstance(x, ir.Var) and x not in blocks):
                        if not isinstance(t, ir.For):
                            raise _Unchecked(f"{_what(t)} depends on '{v.name}', known only at run "
                                             f"time", t.loc)
                        free += [v] if v not in free else []
                        bounded += [t] if t not in bounded else []
        if len(free) > 1:
            raise _Unchecked(f"loop bounds depend on {len(free)} values known only at run time "
                             f"({', '.join(v.name for v in free)})", bounded[0].loc)
        block_used = any(isinstance(x, ir.Var) and x in blocks for p in parts for x in subexprs(p))
        seen: set = set()
        for coords in self._blocks(extents) if block_used else [None]:
            env = {} if coords is None else dict(zip(self.kernel.block_vars, coords))
            for value in self._scalar_values(free, bounded, parts, env) if free else [None]:
                if value is not None:
                    env = {**env, free[0]: value}
                key = tuple(evaluate(p, env) for p in parts)
                if key in seen:
                    continue
                seen.add(key)
                if len(seen) > MAX_CASES:
                    raise _Unchecked(f"more than {MAX_CASES} distinct run-time cases to simulate",
                                     self.kernel.loc)
                where = "every block" if coords is None else f"block {coords}"
                yield where + ("" if value is None else f" with {free[0].name}={value}"), env

    def _blocks(self, extents: list) -> Iterator[tuple[int, ...]]:
        if math.prod(extents) > MAX_BLOCKS:
            raise _Unchecked(f"the barrier protocol depends on the block index, and the grid has "
                             f"more than {MAX_BLOCKS} blocks", self.kernel.loc)
        for coords in itertools.product(*(range(n) for n in reversed(extents))):
            yield coords[::-1]

    def _scalar_values(self, free, bounded, parts, env) -> list[int]:
        """Values of the runtime scalar ``free[0]`` (bounded unrolling: see the module doc)."""
        period = 1
        for loop in bounded:
            p = protocol.period(loop, evaluate(loop.step, env))
            if p is None:
                raise _Unchecked(f"the barrier operations in this loop depend on '{loop.var.name}' "
                                 f"in a way that does not repeat, and its trip count on "
                                 f"'{free[0].name}', known only at run time", loop.loc)
            period = math.lcm(period, p)
        mine = [p for p in parts if free[0] in set(subexprs(p))]
        values, keys = [], set()
        for v in range(MAX_SCALAR):
            key = tuple(evaluate(p, {**env, free[0]: v}) for p in mine)
            if key not in keys:
                keys.add(key)
                values.append(v)
                if len(values) == 2 * period + 2:
                    break
        return values

    # -- one case: the roles run concurrently -----------------------------------------------------
    def _simulate(self, where: str, env: dict) -> None:
        bars: dict[protocol.Key, tuple[int, int]] = {}
        tasks = [_Task(name, threads, self._ops(body, dict(env)))
                 for name, threads, body in self.streams]
        while True:
            moved = False
            for t in tasks:
                if t.done or t.waiting is not None and not _passes(bars, t.waiting):
                    continue
                t.waiting = None
                moved = True
                op = next(t.ops, None)
                if op is None:
                    t.done = True
                    continue
                self.budget -= 1
                if self.budget < 0:
                    raise _Unchecked(f"more than {MAX_OPERATIONS} barrier operations to simulate",
                                     op.stmt.loc)
                if op.parity is None:
                    bars[op.key] = protocol.arrive(*bars.get(op.key, (0, 0)), t.threads, op.count)
                elif not _passes(bars, op):
                    t.waiting = op
            if all(t.done for t in tasks):
                return
            if not moved:
                raise self._deadlock(where, tasks, bars)

    def _ops(self, s: ir.Stmt, env: dict) -> Iterator[_Op]:
        if isinstance(s, ir.Seq):
            for t in s.stmts:
                if self._has_syncs(t):
                    yield from self._ops(t, env)
        elif isinstance(s, ir.For):
            start, step, trip = protocol.loop_range(s, env)
            if trip is None:
                raise _Unchecked("the trip count of this loop could not be evaluated", s.loc)
            for k in range(trip):
                env[s.var] = start + k * step
                yield from self._ops(s.body, env)
        elif isinstance(s, ir.If):
            yield from self._ops(s.then if self._value(s.cond, env, s) else s.orelse, env)
        elif isinstance(s, (ir.BarrierArrive, ir.BarrierWait)):
            key, count = protocol.barrier_at(s.barrier, self._value(s.barrier.index, env, s), s.loc)
            parity = self._value(s.parity, env, s) & 1 if isinstance(s, ir.BarrierWait) else None
            yield _Op(s, key, count, parity)

    def _has_syncs(self, s: ir.Stmt) -> bool:
        hit = self._syncs.get(id(s))
        if hit is None:
            hit = self._syncs[id(s)] = protocol.syncs_in(s)
        return hit

    def _value(self, e: ir.Expr, env: dict, s: ir.Stmt) -> int:
        v = evaluate(e, env)
        if v is None:
            raise _Unchecked(f"a value of {_what(s)} could not be evaluated", s.loc)
        return int(v)

    def _deadlock(self, where: str, tasks: list[_Task], bars: dict) -> CompileError:
        blocked = []
        for t in tasks:
            op = t.waiting
            if t.done or op is None:
                blocked.append((t.name, None))
                continue
            phase, arrived = bars.get(op.key, (0, 0))
            state = protocol.barrier_state(*op.key, phase, op.count - arrived, op.count, 0)
            blocked.append((t.name, protocol.wait_text(op.stmt.loc, op.parity, *op.key, state)))
        first = next(t.waiting for t in tasks if not t.done)
        notes = [f"on target '{self.config.name}' these waits never pass and the kernel hangs; "
                 f"the reference interpreter (target 'interpret') reports this deadlock when it "
                 f"runs the program",
                 "a wait on parity p passes once the barrier's phase of parity p has completed: on "
                 "a fresh barrier a wait on parity 1 passes at once, one on parity 0 needs the "
                 "first phase to complete"]
        return CompileError(protocol.deadlock_report(where, blocked), first.stmt.loc, notes)


def _passes(bars: dict, op: _Op) -> bool:
    return protocol.passes(bars.get(op.key, (0, 0))[0], op.parity)


def _runtime_parts(e: ir.Expr, loops: set) -> list[ir.Expr]:
    """The largest subexpressions of ``e`` free of loop indices that are not constants."""
    if not any(isinstance(x, ir.Var) and x in loops for x in subexprs(e)):
        return [] if evaluate(e) is not None else [e]
    return [p for x in protocol.operands(e) for p in _runtime_parts(x, loops)]


def _what(s: ir.Stmt) -> str:
    if isinstance(s, ir.For):
        return "the bounds of this loop"
    if isinstance(s, ir.If):
        return "the condition of this branch"
    return "this barrier operation"
