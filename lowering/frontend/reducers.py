"""``T.alloc_reducer``: a fragment that the iterations of a ``T.Parallel`` combine into.

TileLang's reducer (its ``replication=`` form): inside ``T.Parallel(M, N)``, ``r[i] += v``
(``op="sum"``), ``r[i] = T.max(r[i], v)`` (``"max"``) or ``r[i] = T.min(r[i], v)`` (``"min"``)
combines the ``v`` of every iteration into ``r[i]``: the iterations that share ``i`` are a
reduction over the Parallel's other indices, not a race. How TileLang places the partial results
on threads (``replication``) changes no result; in tilews the reduction is complete when the
``T.Parallel`` ends, so ``T.finalize_reducer`` has nothing left to do.

Contract (``split``, when a ``T.Parallel`` closes):
* Input: the Parallel as built, and the kernel's reducer buffers with their combiners.
* An update of a reducer must have the combiner's form above, index the reducer with distinct
  Parallel indices only, and be the Parallel's only access to that reducer; otherwise a
  ``CompileError`` at the update's line.
* Output, for each update over fewer indices than the Parallel has: the update stores ``v`` into
  a fresh fragment over the whole Parallel (filled first with the combiner's identity where the
  update is conditional); after the Parallel, ``Reduce``s of that fragment over the indices the
  reducer lacks, then a ``Parallel`` over the reducer's indices combining the result into it.
  Updates that name every index are ordinary element updates and stay.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from .. import ir
from ..errors import CompileError
from ..traverse import exprs_of, subexprs, transform, walk

_COMBINE = {ir.ReduceKind.MAX: ir.MathFn.MAX, ir.ReduceKind.MIN: ir.MathFn.MIN}
_SPELLING = {ir.ReduceKind.SUM: "r[i] += v", ir.ReduceKind.MAX: "r[i] = T.max(r[i], v)",
             ir.ReduceKind.MIN: "r[i] = T.min(r[i], v)"}


def split(par: ir.Parallel, reducers: dict[ir.Buffer, ir.ReduceKind],
          fresh: Callable[[str], str]) -> tuple[list[ir.Alloc], list[ir.Stmt]]:
    """The allocations and statements replacing ``par`` (module docstring)."""
    updates = [s for s in walk(par.body) if isinstance(s, ir.Store) and s.buffer in reducers]
    if not updates:
        return [], [par]
    allocs: list[ir.Alloc] = []
    before: list[ir.Stmt] = []
    after: list[ir.Stmt] = []
    replaced: dict[int, ir.Stmt] = {}
    for u in updates:
        kind = reducers[u.buffer]
        v = _contribution(u, kind)
        _check(par, u, kind)
        kept = [par.vars.index(i) for i in u.indices]
        if len(kept) == len(par.vars):
            continue
        loc = u.loc
        part = _fragment(fresh(f"{u.buffer.name}_part"), par.extents, u.buffer.dtype, loc)
        allocs.append(ir.Alloc(part, loc))
        replaced[id(u)] = ir.Store(part, par.vars, v, loc)
        if not any(s is u for s in par.body.stmts):     # conditional: iterations that skip it add nothing
            whole = ir.Region(part, tuple(_i32(0, loc) for _ in par.extents), par.extents, loc)
            before.append(ir.Fill(whole, _identity(kind, u.buffer.dtype, loc), loc))
        shape, src = list(par.extents), part
        for d in sorted(set(range(len(par.vars))) - set(kept), reverse=True):
            shape.pop(d)
            dst = _fragment(fresh(f"{u.buffer.name}_sum"), tuple(shape), u.buffer.dtype, loc)
            allocs.append(ir.Alloc(dst, loc))
            after.append(ir.Reduce(kind, src, dst, d, True, loc))
            src = dst
        after.append(_combine(u, kind, src, sorted(kept), par, fresh))
    body = transform(par.body, lambda s: replaced.get(id(s)))
    return allocs, before + [dataclasses.replace(par, body=body)] + after


def _contribution(u: ir.Store, kind: ir.ReduceKind) -> ir.Expr:
    """``v`` of an update ``r[i] = combine(r[i], v)``."""
    e = u.value
    own = lambda x: isinstance(x, ir.Load) and x.buffer is u.buffer and x.indices == u.indices  # noqa: E731
    operands = ((e.a, e.b) if isinstance(e, ir.BinOp) and e.op is ir.BinOpKind.ADD
                and kind is ir.ReduceKind.SUM else
                e.args if isinstance(e, ir.Call) and e.fn is _COMBINE.get(kind) else ())
    if len(operands) == 2 and sum(map(own, operands)) == 1:
        return operands[1] if own(operands[0]) else operands[0]
    raise CompileError(f"reducer '{u.buffer.name}' (op=\"{kind.value}\") is updated inside "
                       f"T.Parallel as `{_SPELLING[kind]}`", u.loc)


def _check(par: ir.Parallel, u: ir.Store, kind: ir.ReduceKind) -> None:
    if len(set(u.indices)) != len(u.indices) or not all(i in par.vars for i in u.indices):
        raise CompileError(f"reducer '{u.buffer.name}' is indexed with T.Parallel indices only "
                           f"(each once): the indices it lacks are the ones reduced over", u.loc)
    accesses = sum(1 for s in walk(par.body) for e in exprs_of(s) for x in subexprs(e)
                   if isinstance(x, ir.Load) and x.buffer is u.buffer)
    writes = sum(1 for s in walk(par.body) if isinstance(s, ir.Store) and s.buffer is u.buffer)
    if accesses != 1 or writes != 1:
        raise CompileError(f"reducer '{u.buffer.name}' is accessed in this T.Parallel other than "
                           f"by its one update `{_SPELLING[kind]}`: its value is only known "
                           f"after the T.Parallel", u.loc)


def _combine(u: ir.Store, kind: ir.ReduceKind, total: ir.Buffer, kept: list[int],
             par: ir.Parallel, fresh) -> ir.Parallel:
    """``r[i] = combine(r[i], total[i])`` over the reducer's indices."""
    loc = u.loc
    new = {par.vars[k]: ir.Var(fresh(par.vars[k].name), ir.DType.I32, ir.VarKind.PARALLEL, loc)
           for k in kept}
    at = tuple(new[i] for i in u.indices)
    old = ir.Load(u.buffer, at, loc)
    part = ir.Load(total, tuple(new[par.vars[k]] for k in kept), loc)
    value = (ir.BinOp(ir.BinOpKind.ADD, old, part, u.buffer.dtype, loc) if kind is ir.ReduceKind.SUM
             else ir.Call(_COMBINE[kind], (old, part), u.buffer.dtype, loc))
    return ir.Parallel(tuple(new.values()), tuple(par.extents[k] for k in kept),
                       ir.Seq((ir.Store(u.buffer, at, value, loc),), loc), loc)


def _identity(kind: ir.ReduceKind, dtype: ir.DType, loc: ir.Loc) -> ir.Const:
    if kind is ir.ReduceKind.SUM:
        return ir.Const(0.0 if dtype.is_float else 0, dtype, loc)
    if dtype.is_float:
        return ir.Const(-math.inf if kind is ir.ReduceKind.MAX else math.inf, dtype, loc)
    lo, hi = ((0, 2 ** dtype.bits - 1) if dtype.record.kind == "uint"
              else (-2 ** (dtype.bits - 1), 2 ** (dtype.bits - 1) - 1))
    return ir.Const(lo if kind is ir.ReduceKind.MAX else hi, dtype, loc)


def _fragment(name: str, shape: tuple[int, ...], dtype: ir.DType, loc: ir.Loc) -> ir.Buffer:
    return ir.Buffer(name, tuple(_i32(d, loc) for d in shape), dtype, ir.Scope.FRAGMENT, (), loc)


def _i32(v: int, loc: ir.Loc) -> ir.Const:
    return ir.Const(v, ir.DType.I32, loc)
