"""Races between the iterations of one run of a block-wide ``T.Parallel``, seen as it runs.

The iterations of an ``ir.Parallel`` are independent: a target runs them in any order or at
once. The interpreter runs them as one numpy vector, one statement for all of them at a time,
which is one order among many; this tracker checks that nothing the program computes depends on
it. The frontend refuses the races the indices decide (``frontend/parallel_races.py``); the ones
that depend on values (an index read from a tensor, a condition) are found here.

Contract:
* ``suspects(par)``: the buffers ``par`` writes (stores or adds into) that could race: all but
  those whose every access in ``par`` uses one index tuple giving each loop variable of extent
  > 1 a dim of its own, ``v`` or ``v`` plus or minus what reads no loop variable
  (``acc[i, j] = acc[i, j] * s``, ``Out[row + i, j] = ...``: each iteration its own element).
* ``IterationRaces(par, watched)``, for one run of ``par`` (not per-thread code: the thread
  level has its own tracker, ``thread_races``), watches the buffers ``watched`` names (its
  ``suspects``). ``access`` takes the element lanes of each load, store and atomic add as
  ``memory.Memory`` evaluates them (index arrays broadcast over the Parallel's extents, the
  active lanes); ``finish`` judges them when the run ends.
* A race, raised by ``finish`` as ``RaceError``: an element written by one iteration and written
  or read by another, unless both are atomic adds. The message names the buffer, the element,
  both iterations (``i=0, j=1``) and both source lines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .. import ir
from ..errors import RaceError
from ..traverse import buffers_written, element_accesses, subexprs, walk
from .messages import at

_READ, _WRITE, _ADD = 0, 1, 2


@dataclass
class _Accesses:
    """The accesses of one buffer: one entry per (element, iteration, access)."""
    shape: tuple[int, ...]
    cells: list = field(default_factory=list)
    iters: list = field(default_factory=list)
    kinds: list = field(default_factory=list)
    sites: list = field(default_factory=list)


def suspects(par: ir.Parallel) -> set[str]:
    spread = {v for v, n in zip(par.vars, par.extents) if n > 1}
    indices: dict[str, set] = {}
    for s in walk(par.body):
        for b, idx in element_accesses(s):
            indices.setdefault(b.name, set()).add(idx)
        if isinstance(s, ir.AtomicAdd):
            indices.setdefault(s.dst.buffer.name, set()).add(s.dst.starts)
    written = {b.name for s in walk(par.body) for b in buffers_written(s)}
    return {b for b in written if len(indices.get(b, ())) != 1
            or not spread <= {_offset_var(e, par.vars) for e in next(iter(indices[b]))}}


def _offset_var(e: ir.Expr, vars_: tuple[ir.Var, ...]) -> Optional[ir.Var]:
    """``v`` where ``e`` is loop variable ``v``, or ``v`` plus or minus an expression reading no
    loop variable; else None."""
    if e in vars_:
        return e
    if isinstance(e, ir.BinOp) and e.op in (ir.BinOpKind.ADD, ir.BinOpKind.SUB):
        pairs = ((e.a, e.b), (e.b, e.a)) if e.op is ir.BinOpKind.ADD else ((e.a, e.b),)
        for v, rest in pairs:
            if v in vars_ and not any(x in vars_ for x in subexprs(rest)):
                return v
    return None


class IterationRaces:
    def __init__(self, par: ir.Parallel, watched: set[str]):
        self.par = par
        self.watched = watched
        self._iters = np.arange(math.prod(par.extents), dtype=np.int64).reshape(par.extents)
        self._buffers: dict[str, _Accesses] = {}
        self._locs: list[ir.Loc] = []

    def access(self, buf: ir.Buffer, shape: tuple[int, ...], idx: Sequence[np.ndarray],
               active: Optional[np.ndarray], write: bool, atomic: bool, loc: ir.Loc) -> None:
        """Element lanes into ``buf`` (of array ``shape``): index arrays and the active lanes
        (None for all), broadcastable to the Parallel's extents."""
        if buf.name not in self.watched:
            return
        extents = self._iters.shape
        cells = np.ravel_multi_index(tuple(np.broadcast_to(i, extents) for i in idx), shape)
        iters = self._iters
        if active is not None:
            keep = np.broadcast_to(active, extents)
            cells, iters = cells[keep], iters[keep]
        a = self._buffers.setdefault(buf.name, _Accesses(shape))
        a.cells.append(cells.ravel())
        a.iters.append(iters.ravel())
        a.kinds.append(np.full(cells.size, _ADD if atomic else _WRITE if write else _READ, np.int8))
        a.sites.append(np.full(cells.size, len(self._locs), np.int32))
        self._locs.append(loc)

    def finish(self) -> None:
        for name, a in self._buffers.items():
            self._judge(name, a, *(np.concatenate(x) for x in (a.cells, a.iters, a.kinds, a.sites)))

    def _judge(self, name: str, a: _Accesses, cells, iters, kinds, sites) -> None:
        w = kinds != _READ
        if not w.any():
            return
        written, which = np.unique(cells[w], return_inverse=True)
        lo = np.full(written.size, np.iinfo(np.int64).max)
        hi = np.full(written.size, -1)
        np.minimum.at(lo, which, iters[w])
        np.maximum.at(hi, which, iters[w])
        # a plain write, or a read, of an element another iteration writes
        at_cell = np.searchsorted(written, cells)
        hit = (kinds != _ADD) & (at_cell < written.size)
        at_cell = np.minimum(at_cell, written.size - 1)
        hit &= written[at_cell] == cells
        bad = hit & ((lo[at_cell] != iters) | (hi[at_cell] != iters))
        if not bad.any():
            return
        k = int(np.argmax(bad))
        other = lo[at_cell[k]] if lo[at_cell[k]] != iters[k] else hi[at_cell[k]]
        m = int(np.argmax(w & (cells == cells[k]) & (iters == other)))
        element = [int(x) for x in np.unravel_index(int(cells[k]), a.shape)]
        kind = "write" if kinds[k] == _WRITE else "read"
        raise RaceError(at(self._locs[sites[k]], (
            f"data race in T.Parallel on '{name}': the {kind} of element {element} by iteration "
            f"({self._iteration(int(iters[k]))}) meets the {_KIND[int(kinds[m])]} of it by "
            f"iteration ({self._iteration(int(other))}) at {self._locs[sites[m]]}; the iterations "
            f"of T.Parallel run in no fixed order")))

    def _iteration(self, n: int) -> str:
        coords = np.unravel_index(n, self._iters.shape)
        return ", ".join(f"{v.name}={int(c)}" for v, c in zip(self.par.vars, coords))


_KIND = {_WRITE: "write", _ADD: "atomic add"}
