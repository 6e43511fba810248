"""despecialize: run a warp-specialized program as one stream, where that is valid.

Requires:  the source form (``Role`` blocks inside the program, no ``WarpSpecialize``).
           In the pipelines of backends that run one stream of threads (tl, metal).
Ensures:   if the program has roles or barriers: every ``Role`` is replaced by its body (program
           order), every ``BarrierArrive``/``BarrierWait`` and barrier ``Alloc`` is removed and every
           ``Copy.barrier`` is cleared, with a note saying so — but only after checking that running
           the statements in source order satisfies the barrier protocol: every wait would already
           pass when reached. Otherwise ``CompileError`` at the offending statement saying why.
Preserves: program meaning (sequential source order is one legal schedule of the roles, so a
           race-free program computes the same values) and every remaining node's loc.

The check simulates the barriers abstractly: per mbarrier its completed-phase parity and pending
arrivals (threads; a role of warp groups g arrives with 128*len(g), code outside roles with the
kernel's threads; a phase completes at the barrier's arrive count). ``wait(b, p)`` passes when the
current phase's parity differs from p, so a fresh barrier passes a wait on parity 1. An asynchronous
copy completes before the next statement in one stream, so its transaction bytes never hold a
phase open. Loops are simulated iteration by iteration on the set of reachable barrier states; as
the loop index enters barrier indices and parities only periodically (``k % S``, ``(k // S) & 1``),
a repeated (states, iteration mod period) pair ends the simulation with the exact result for every
trip count, including unknown ones. The barrier arithmetic, barrier keys and loop periods are
``lowering/protocol.py``'s, shared with check_barriers (the same protocol, roles concurrent).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, protocol, roles
from ..errors import CompileError, InternalError
from ..simplify import evaluate
from ..config import BackendConfig
from ..traverse import rewrite, walk

# Iterations simulated before giving up on a loop whose barrier behaviour never repeats.
MAX_ITERATIONS = 4096

State = tuple  # sorted ((barrier name, index), (phase parity, pending arrivals)) pairs


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    stmts = list(walk(kernel.body))
    if any(isinstance(s, ir.WarpSpecialize) for s in stmts):
        raise InternalError("despecialize expects the source form (Role blocks), not "
                            "WarpSpecialize", kernel.loc)
    found = roles.role_sets(kernel.body)
    if not found and not any(_is_barrier_op(s) for s in stmts):
        return kernel
    _Simulation(kernel, config).stmt(kernel.body, frozenset([()]), {}, None)
    body = rewrite(kernel.body, _strip)
    note = (f"despecialize: target '{config.name}' has no warp specialization; "
            + (f"roles {', '.join(roles.describe(r) for r in found)} run as one stream in source "
               f"order, " if found else "")
            + f"{sum(isinstance(s, (ir.BarrierArrive, ir.BarrierWait)) for s in stmts)} barrier "
              f"arrive/wait operation(s) removed (the barrier protocol holds in source order)"
            + ("; the roles' register requests (T.set_max_nreg) do not apply"
               if any(isinstance(s, ir.Role) and s.num_regs for s in stmts) else ""))
    return dataclasses.replace(kernel, body=body).with_note(note)


def _is_barrier_op(s: ir.Stmt) -> bool:
    return (isinstance(s, (ir.BarrierArrive, ir.BarrierWait))
            or isinstance(s, ir.Copy) and s.barrier is not None
            or isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER)


def _strip(s: ir.Stmt) -> Optional[ir.Stmt]:
    if isinstance(s, ir.Role):
        return s.body
    if isinstance(s, (ir.BarrierArrive, ir.BarrierWait)) or (
            isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER):
        return ir.Seq((), s.loc)
    if isinstance(s, ir.Copy) and s.barrier is not None:
        return dataclasses.replace(s, barrier=None)
    return None


# ----------------------------------------------------------------------------------------------
# the simulation


class _Simulation:
    def __init__(self, kernel: ir.Kernel, config: BackendConfig):
        self.kernel = kernel
        self.config = config
        self.arrivers = {name: [roles.describe(w) for w in ws]
                         for name, ws in protocol.arriving_roles(kernel.body).items()}

    def stmt(self, s: ir.Stmt, states: frozenset, env: dict, role) -> frozenset:
        if isinstance(s, ir.Seq):
            for t in s.stmts:
                states = self.stmt(t, states, env, role)
            return states
        if isinstance(s, ir.Role):
            return self.stmt(s.body, states, env, s.warpgroups)
        if isinstance(s, ir.BarrierArrive):
            key, count = self._barrier(s.barrier, env, s.loc)
            threads = self.kernel.threads if role is None else 128 * len(role)
            return frozenset(_arrive(st, key, count, threads) for st in states)
        if isinstance(s, ir.BarrierWait):
            key, _ = self._barrier(s.barrier, env, s.loc)
            parity = self._value(s.parity, env, s.loc, "the parity of this wait")
            for st in states:
                if not protocol.passes(dict(st).get(key, (0, 0))[0], parity):
                    raise self._blocked(s, key, parity & 1, env, role)
            return states
        if isinstance(s, ir.If):
            if not protocol.syncs_in(s):
                return states
            cond = evaluate(s.cond, env)
            if cond is None:
                raise CompileError(self._prefix() + "barrier operations under a condition known "
                                   "only at run time cannot be checked for one-stream execution",
                                   s.loc)
            return self.stmt(s.then if cond else s.orelse, states, env, role)
        if isinstance(s, ir.For):
            return self._loop(s, states, env, role) if protocol.syncs_in(s.body) else states
        return states

    def _loop(self, s: ir.For, states: frozenset, env: dict, role) -> frozenset:
        start, step, trip = protocol.loop_range(s, env)
        period = protocol.period(s, step)
        if period is None and trip is None:
            raise CompileError(self._prefix() + f"the barrier operations in this loop depend on "
                               f"'{s.var.name}' in a way that does not repeat, and the trip count is "
                               f"known only at run time; they cannot be checked for one-stream "
                               f"execution", s.loc)
        history = [states]
        seen = {(states, 0): 0}
        for k in range(MAX_ITERATIONS):
            if trip is not None and k == trip:
                return history[k]
            inner = dict(env)
            if start is not None and step is not None:
                inner[s.var] = start + k * step
            history.append(self.stmt(s.body, history[k], inner, role))
            if period is not None:
                first = seen.setdefault((history[k + 1], (k + 1) % period), k + 1)
                if first != k + 1:
                    if trip is None:
                        return frozenset().union(*history)
                    return history[first + (trip - first) % (k + 1 - first)]
        raise CompileError(self._prefix() + f"the barrier operations in this loop did not settle "
                           f"into a repeating pattern within {MAX_ITERATIONS} iterations", s.loc)

    def _barrier(self, ref: ir.BarrierRef, env: dict, loc: ir.Loc):
        i = self._value(ref.index, env, loc, f"the index of barrier '{ref.buffer.name}'")
        return protocol.barrier_at(ref, i, loc)

    def _value(self, e: ir.Expr, env: dict, loc: ir.Loc, what: str) -> int:
        v = evaluate(e, env)
        if v is None:
            raise CompileError(self._prefix() + f"{what} depends on a value known only at run time, "
                               f"so the barrier protocol cannot be checked for one-stream execution",
                               loc)
        return int(v)

    def _prefix(self) -> str:
        return f"cannot run the roles as one stream on target '{self.config.name}': "

    def _blocked(self, s: ir.BarrierWait, key, parity: int, env: dict, role) -> CompileError:
        name = key[0] if len(s.barrier.buffer.arrive_counts) == 1 else f"{key[0]}[{key[1]}]"
        mine = None if role is None else roles.describe(role)
        who = "the kernel" if mine is None else f"role {mine}"
        arrivers = [r for r in self.arrivers.get(key[0], []) if r != mine]
        verb = " arrive" if len(arrivers) > 1 else " arrives"
        by = " and ".join(arrivers) + verb if arrivers else "anything arrives"
        at = ", ".join(f"{v.name}={val}" for v, val in env.items())
        msg = (f"{who} waits on `{name}` (parity {parity}) before {by} on it in program "
               f"order{f' (at {at})' if at else ''}; cannot run as one stream on target "
               f"'{self.config.name}', which has no warp specialization")
        notes = ["without warp specialization the roles run one after another in source order: "
                 "put the producing role's section before the consuming one's, or compile for a "
                 "target with warp specialization (hopper)"]
        return CompileError(msg, s.loc, notes)


def _arrive(state: State, key, count: int, threads: int) -> State:
    d = dict(state)
    phase, pending = protocol.arrive(*d.get(key, (0, 0)), threads, count)
    d[key] = (phase & 1, pending)
    return tuple(sorted(d.items()))
