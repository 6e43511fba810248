"""Races between the iterations of a ``T.Parallel`` that its indices decide at build time.

The iterations of a ``T.Parallel`` are independent (``ir.Parallel``): a target runs them in any
order or at once, so two iterations writing one element, or one reading an element another
writes, give a different answer on each target. Whether two iterations meet on an element
usually depends on values (an index read from a tensor, a condition): the interpreter checks
those when it runs (``interpreter/iteration_races.py``). Two cases the indices alone decide.

Contract (``check``, on each ``T.Parallel`` as the frontend closes it, after ``reducers.split``
has turned reducer updates into element stores over every index):
* A store (not ``T.atomic_add``: atomic adds of several iterations into one element are meant)
  whose index does not use a loop variable ``v`` of extent > 1, anywhere in its index
  expressions or in a condition guarding it, writes the same element from every value of ``v``:
  a ``CompileError`` at the store's line naming the buffer and ``v``, on every target.
* Then the accesses every iteration makes (stores outside any ``if``; loads in their indices and
  values, in atomic adds outside any ``if`` and in the conditions of the outermost ``if``s, not in
  a branch of ``T.if_then_else``) whose index in each dim is an affine function of the loop
  variables with integer coefficients plus terms the iterations share (``bx * M``, a serial loop's variable: the same in both
  accesses, reading no buffer): a store and a load of one buffer, or two stores of it (a store
  with itself included), such that one iteration's access and another's meet on an element
  that is inside the buffer (where its shape and the index decide that; on-chip buffers, where
  an access outside is an error anyway, need not decide it) — iteration (i, j) reads ``A[i, 0]``,
  which (i, 0) writes; or ``A[i] = A[i + 1]``; or ``Y[i + j] = ...`` — is a ``CompileError`` at
  the store's line naming the buffer, the element and both iterations.
* Everything else passes: accesses that meet only within one iteration (``A[i, j] = A[i, j] *
  2``, ``A[i] = A[i + n]`` over ``T.Parallel(n)``), stores indexed by every variable through a
  value read with them, guarded accesses (``if j == 0:``), which the interpreter checks when it
  runs. Parallels of per-thread code (``threads.py``) are not built here and follow the thread
  level's rules.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from .. import ir
from ..errors import CompileError
from ..simplify import linear
from ..traverse import exprs_of, subexprs

# Above this many iterations the pairwise check is skipped (the interpreter still checks).
_MAX_ITERATIONS = 1 << 18


def check(par: ir.Parallel) -> None:
    _check_missing_vars(par)
    _check_meeting_accesses(par)


def _check_missing_vars(par: ir.Parallel) -> None:
    spread = [v for v, n in zip(par.vars, par.extents) if n > 1]
    for store, guards in _stores(par.body, ()):
        used = {x for e in (*store.indices, *guards) for x in subexprs(e) if isinstance(x, ir.Var)}
        missing = [v for v in spread if v not in used]
        if missing:
            v = missing[0]
            n = par.extents[par.vars.index(v)]
            raise CompileError(
                f"race in T.Parallel: this store into '{store.buffer.name}' does not use loop "
                f"variable '{v.name}' in its index, so all {n} iterations of '{v.name}' write the "
                f"same element", store.loc,
                [f"index the store by '{v.name}', guard it (`if {v.name} == 0:`), accumulate "
                 f"with T.atomic_add, or reduce with T.reduce_sum/T.reduce_max (or a "
                 f"T.alloc_reducer) instead"])


def _stores(body: ir.Seq, guards: tuple[ir.Expr, ...]) -> Iterator[tuple[ir.Store, tuple]]:
    """Each element store of ``body`` with the conditions of the ``if``s around it."""
    for s in body.stmts:
        if isinstance(s, ir.Store):
            yield s, guards
        elif isinstance(s, ir.If):
            yield from _stores(s.then, guards + (s.cond,))
            yield from _stores(s.orelse, guards + (s.cond,))


@dataclass(frozen=True)
class _Access:
    buffer: ir.Buffer
    indices: tuple[ir.Expr, ...]
    write: bool
    loc: ir.Loc


def _check_meeting_accesses(par: ir.Parallel) -> None:
    if math.prod(par.extents) > _MAX_ITERATIONS:
        return
    accesses = list(_unconditional_accesses(par.body))
    for a, b in itertools.combinations_with_replacement(accesses, 2):
        if a.buffer != b.buffer or not (a.write or b.write) or (a is not b and a.indices == b.indices):
            continue     # the same index tuple meets only within an iteration, unless the store
                         # with itself (checked as its own pair) writes one element twice
        store, other = (a, b) if a.write else (b, a)
        met = _meeting(par, store, other)
        if met is not None:
            element, p, q = met
            what = "writes" if other.write else "reads"
            which = "an element" if element is None else f"element {element}"
            elsewhere = "" if other.loc.line == store.loc.line else f" (at line {other.loc.line})"
            raise CompileError(
                f"race in T.Parallel: iteration {_iteration(par, q)} {what} {which} of "
                f"'{store.buffer.name}'{elsewhere}, which iteration {_iteration(par, p)} writes "
                f"here", store.loc,
                ["write the result into another buffer (or read a copy made before the loop), so "
                 "that no iteration reads or writes an element another iteration writes"])


def _unconditional_accesses(body: ir.Seq) -> Iterator[_Access]:
    """The element accesses every iteration makes: stores outside ``if``s, the loads they and
    the atomic adds outside ``if``s evaluate, and the loads of the outermost ``if`` conditions."""
    for s in body.stmts:
        if isinstance(s, ir.Store):
            yield _Access(s.buffer, s.indices, True, s.loc)
        if isinstance(s, (ir.Store, ir.If, ir.AtomicAdd)):
            for e in exprs_of(s):
                yield from _loads(e)


def _loads(e: ir.Expr) -> Iterator[_Access]:
    """The loads ``e`` always evaluates (not those in a branch of a select)."""
    branches = {id(x) for sel in subexprs(e) if isinstance(sel, ir.Select)
                for branch in (sel.a, sel.b) for x in subexprs(branch)}
    for x in subexprs(e):
        if isinstance(x, ir.Load) and id(x) not in branches:
            yield _Access(x.buffer, x.indices, False, x.loc)


def _meeting(par: ir.Parallel, store: _Access, other: _Access):
    """(element or None where the indices leave part of it to shared terms, p, q): iterations
    p != q where ``store`` at p and ``other`` at q touch one element inside the buffer (flat
    iteration numbers); None where there is none or the indices do not decide it."""
    grid = np.indices(par.extents).reshape(len(par.extents), -1)
    at_p, at_q, inside = [], [], np.ones((2, grid.shape[1]), dtype=bool)
    shared_terms = False
    for d, (x, y) in enumerate(zip(store.indices, other.indices)):
        forms = _affine(x, par.vars), _affine(y, par.vars)
        if None in forms or forms[0][1] != forms[1][1]:
            return None
        vals = [c + np.dot(np.asarray(k, dtype=np.int64), grid) for k, _, c in forms]
        n = ir.as_int(store.buffer.shape[d])
        if n is not None and not forms[0][1]:
            inside &= np.stack([(v >= 0) & (v < n) for v in vals])
        elif store.buffer.scope is ir.Scope.GLOBAL:
            return None        # outside a global tensor, loads read 0 and stores are dropped
        shared_terms |= bool(forms[0][1])
        at_p.append(vals[0])
        at_q.append(vals[1])
    keys_p, keys_q = _keys(np.array(at_p), np.array(at_q))
    ip, iq = np.flatnonzero(inside[0]), np.flatnonzero(inside[1])
    if not ip.size or not iq.size:
        return None
    iq = iq[np.argsort(keys_q[iq], kind="stable")]
    lo = np.searchsorted(keys_q[iq], keys_p[ip], "left")
    count = np.searchsorted(keys_q[iq], keys_p[ip], "right") - lo
    first = iq[np.minimum(lo, iq.size - 1)]
    meets = np.flatnonzero((count >= 2) | ((count == 1) & (first != ip)))
    if not meets.size:
        return None
    w = meets[0]
    p, q = int(ip[w]), int(first[w] if first[w] != ip[w] else iq[lo[w] + 1])
    return (None if shared_terms else [int(v[p]) for v in at_p]), p, q


def _affine(e: ir.Expr, vars_: tuple[ir.Var, ...]) -> Optional[tuple[tuple[int, ...], frozenset, int]]:
    """``e`` as (coefficients of the loop variables, the other terms with their coefficients,
    constant), where the other terms read no loop variable and no buffer; else None."""
    form = linear(e)
    if form is None:
        return None
    rest = {t: k for t, k in form.items() if t is not None and t not in vars_}
    if any(isinstance(x, ir.Load) or x in vars_ for t in rest for x in subexprs(t)):
        return None
    return tuple(form.get(v, 0) for v in vars_), frozenset(rest.items()), form.get(None, 0)


def _keys(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One integer per column of ``a`` and ``b`` (dims x lanes), equal where the columns are."""
    both = np.concatenate([a, b], axis=1)
    both = both - both.min(axis=1, keepdims=True)
    key = np.zeros(both.shape[1], dtype=np.int64)
    for row in both:
        key = key * (int(row.max()) + 1) + row
    return key[:a.shape[1]], key[a.shape[1]:]


def _iteration(par: ir.Parallel, flat: int) -> str:
    at = np.unravel_index(flat, par.extents)
    return "(" + ", ".join(f"{v.name}={int(x)}" for v, x in zip(par.vars, at)) + ")"
