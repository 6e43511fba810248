"""Statements outside every ``T.ws`` block of a kernel that has roles: block-wide steps.

TileLang runs such a statement on all threads of the block, with the block synchronized before
and after it. tilews gives it the same meaning with one role doing the work:

* A *step* is a maximal run of consecutive statements outside roles (loops and branches holding
  no role count as one statement; allocations and statements holding roles end a run).
* Its *executor* is the role owning the fragment or local buffers it touches (registers belong to
  one role), else the first role (in warp-group order) touching its buffers, else the first role.
  The step's other *users* are the roles whose statements, anywhere in the kernel, touch a buffer
  the step touches.
* Without other users the step simply becomes part of the executor's role. Otherwise two fresh
  mbarriers order it: each other user arrives on ``<name>_ready`` (its earlier statements are
  done), the executor waits on it, runs the step and arrives on ``<name>_done``, and each other
  user waits on that before going on. Inside loops the wait parity is the parity of the
  step's execution count (the loops' linearized iteration number); a step inside a runtime
  ``if`` that holds roles has no such count and is refused.

Barrier operations outside roles are left where they are (``verify`` refuses them).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from .. import ir
from ..errors import CompileError
from ..roles import describe, role_sets, role_threads
from ..simplify import fold
from ..traverse import buffers_read, buffers_written, walk

Fresh = Callable[[str], str]


def assign(body: list[ir.Stmt], fresh: Fresh) -> list[ir.Stmt]:
    """The kernel body with every block-wide step inside a role (see the module docstring);
    ``fresh`` names the barriers it adds (their allocations come first)."""
    seq = ir.Seq(tuple(body), body[0].loc if body else ir.UNKNOWN_LOC)
    roles = role_sets(seq)
    if not roles:
        return body
    steps = _Steps(roles, _touched_by_role(seq), fresh)
    out = steps.seq(list(body), (), False)
    return steps.allocs + out


def _touched(s: ir.Stmt) -> set[ir.Buffer]:
    return {b for t in walk(s) for b in buffers_read(t) + buffers_written(t)}


def _touched_by_role(body: ir.Seq) -> dict[tuple[int, ...], set[ir.Buffer]]:
    out: dict[tuple[int, ...], set[ir.Buffer]] = {}
    for r in walk(body):
        if isinstance(r, ir.Role):
            out.setdefault(r.warpgroups, set()).update(_touched(r.body))
    return out


def _holds_role(s: ir.Stmt) -> bool:
    return any(isinstance(t, ir.Role) for t in walk(s))


def _is_step_part(s: ir.Stmt) -> bool:
    return not isinstance(s, (ir.Role, ir.Alloc)) and not _holds_role(s)


class _Steps:
    def __init__(self, roles, touched: dict, fresh: Fresh):
        self.roles = roles
        self.touched = touched
        self.fresh = fresh
        self.allocs: list[ir.Stmt] = []

    def seq(self, stmts: list[ir.Stmt], loops: tuple[ir.For, ...], in_branch: bool) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        run: list[ir.Stmt] = []
        for s in stmts + [None]:
            if s is not None and _is_step_part(s):
                run.append(s)
                continue
            if run:
                out += self.step(run, loops, in_branch)
                run = []
            if s is None:
                break
            if isinstance(s, ir.For) and _holds_role(s):
                s = dataclasses.replace(s, body=self.body(s.body, loops + (s,), in_branch))
            elif isinstance(s, ir.If) and _holds_role(s):
                s = dataclasses.replace(s, then=self.body(s.then, loops, True),
                                        orelse=self.body(s.orelse, loops, True))
            out.append(s)
        return out

    def body(self, s: ir.Seq, loops, in_branch: bool) -> ir.Seq:
        return dataclasses.replace(s, stmts=tuple(self.seq(list(s.stmts), loops, in_branch)))

    def step(self, run: list[ir.Stmt], loops, in_branch: bool) -> list[ir.Stmt]:
        if any(isinstance(t, (ir.BarrierArrive, ir.BarrierWait)) for s in run for t in walk(s)):
            return run
        loc = run[0].loc
        touched = set().union(*(_touched(s) for s in run))
        executor = self.executor(touched, loc)
        others = [r for r in self.roles if r != executor and self.touched.get(r, set()) & touched]
        if not others:
            return [ir.Role(executor, ir.Seq(tuple(run), loc), loc=loc)]
        if in_branch:
            raise CompileError("this statement outside every T.ws block is inside a runtime `if` "
                               "that holds roles; put it inside a `with T.ws(...)` block",
                               loc, [f"roles {', '.join(map(describe, [executor] + others))} "
                                     f"use what it touches"])
        name = self.fresh("block_step")
        ready = self.barrier(f"{name}_ready", sum(role_threads(r) for r in others), loc)
        done = self.barrier(f"{name}_done", role_threads(executor), loc)
        parity = _parity(loops, loc)

        def role(r, *stmts):
            return ir.Role(r, ir.Seq(tuple(stmts), loc), loc=loc)
        return ([role(r, ir.BarrierArrive(ready, loc)) for r in others]
                + [role(executor, ir.BarrierWait(ready, parity, loc), *run,
                        ir.BarrierArrive(done, loc))]
                + [role(r, ir.BarrierWait(done, parity, loc)) for r in others])

    def executor(self, touched: set[ir.Buffer], loc: ir.Loc) -> tuple[int, ...]:
        registers = [b for b in touched if b.scope in (ir.Scope.FRAGMENT, ir.Scope.LOCAL)]
        owners = sorted({r for r in self.roles for b in registers if b in self.touched.get(r, ())})
        if len(owners) > 1:
            raise CompileError(f"this statement outside every T.ws block uses registers of roles "
                               f"{' and '.join(map(describe, owners))}; registers belong to one "
                               f"role", loc)
        users = [r for r in self.roles if self.touched.get(r, set()) & touched]
        return (owners or users or list(self.roles))[0]

    def barrier(self, name: str, count: int, loc: ir.Loc) -> ir.BarrierRef:
        buf = ir.Buffer(self.fresh(name), (ir.const(1, loc=loc),), ir.DType.I64, ir.Scope.BARRIER,
                        (count,), loc)
        self.allocs.append(ir.Alloc(buf, loc))
        return ir.BarrierRef(buf, ir.const(0, loc=loc), loc)


def _parity(loops: tuple[ir.For, ...], loc: ir.Loc) -> ir.Expr:
    """The parity of the number of times a statement inside ``loops`` (outermost first) ran
    before the current iteration: the loops' linearized iteration number, & 1."""
    def op(kind, a, b):
        return ir.BinOp(kind, a, b, ir.DType.I32, loc)
    B = ir.BinOpKind
    n: Optional[ir.Expr] = None
    for f in loops:
        i = op(B.FLOORDIV, op(B.SUB, f.var, f.start), f.step)
        if n is not None:
            span = op(B.ADD, op(B.SUB, f.stop, f.start), op(B.SUB, f.step, ir.const(1, loc=loc)))
            i = op(B.ADD, op(B.MUL, n, op(B.FLOORDIV, span, f.step)), i)
        n = i
    return fold(op(B.AND, n, ir.const(1, loc=loc))) if n is not None else ir.const(0, loc=loc)
