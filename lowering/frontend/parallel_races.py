"""Races between the iterations of a ``T.Parallel`` that its indices decide at build time.

The iterations of a ``T.Parallel`` are independent (``ir.Parallel``): a target runs them in any
order or at once, so two iterations writing one element, or one reading an element another
writes, give a different answer on each target. Whether two iterations meet on an element
usually depends on values (an index read from a tensor, a condition): the interpreter checks
those when it runs (``interpreter/iteration_races.py``). One case the indices alone decide.

Contract (``check``, on each ``T.Parallel`` as the frontend closes it, after ``reducers.split``
has turned reducer updates into element stores over every index):
* A store (not ``T.atomic_add``: atomic adds of several iterations into one element are meant)
  whose index does not use a loop variable ``v`` of extent > 1, anywhere in its index
  expressions or in a condition guarding it, writes the same element from every value of ``v``:
  a ``CompileError`` at the store's line naming the buffer and ``v``, on every target.
* Everything else passes: a store indexed by every variable (directly, through ``i * N + j``,
  or through a value read with them); a store whose guard uses the missing variable
  (``if j == 0:``), which the interpreter checks when it runs. Parallels of per-thread code
  (``threads.py``) are not built here and follow the thread level's rules.
"""
from __future__ import annotations

from typing import Iterator

from .. import ir
from ..errors import CompileError
from ..traverse import subexprs


def check(par: ir.Parallel) -> None:
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
