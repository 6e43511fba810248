"""Race detection between the threads of a block running per-thread code (the thread level).

The interpreter runs a block's threads as one numpy vector, each statement for all of them at
once; a SIMT target runs them concurrently, ordered only by block barriers (``ir.BlockSync``).
This tracker checks that nothing the program computes depends on the difference.

Contract:
* An *epoch* runs from one ``sync()`` (a ``BlockSync``) to the next. Within it, for every element
  of every shared buffer, the tracker keeps who last wrote it (and whether only by atomic adds)
  and who read it, with the statement and source line.
* Accessors (``statement(who)``, before each statement runs): a thread (``thread_ids``: the
  thread of each iteration of a per-thread ``Parallel``, ``x + X * (y + Y * z)`` from its first
  vars; vector dims after them belong to the same thread); ``EVERY``, every thread doing the same
  (a uniform statement outside ``T.Parallel``, a one-iteration block-wide ``Parallel``, loop
  bounds and conditions); ``BLOCK``, the block's threads together in an unknown split (a tile
  operation: copy, fill, reduction, gemm, a block-wide ``Parallel``, a tile atomic add).
* Two accesses of one element in one epoch conflict when at least one writes, they are not both
  atomic adds, and they are not ordered by the accessor itself: one thread's accesses are in its
  program order; ``EVERY`` or ``BLOCK`` within one statement is one access; an ``EVERY`` write
  read by a thread or by ``EVERY`` is that thread's own write (every thread wrote the same).
  ``access``/``box`` raise ``RaceError`` at the first conflict, naming the buffer, the element,
  both accessors (threads by number and (x, y, z)) and both source lines; then record.
* Cost: a few numpy arrays per shared buffer, one entry per element, allocated once; a record
  holds its epoch's number, so ``sync`` only starts the next number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from .. import ir
from ..errors import RaceError
from .messages import at

NONE, EVERY, BLOCK, MANY = -1, -2, -3, -4      # accessors other than a thread (>= 0)
Who = Union[int, np.ndarray]                   # EVERY, BLOCK, or a thread id per lane


@dataclass
class _Accesses:
    """One kind of access (writes or reads) of one shared buffer, one entry per element (flat
    index); an entry counts only in the epoch it was made in."""
    epoch: np.ndarray
    who: np.ndarray         # EVERY, BLOCK, MANY (several threads) or a thread
    stmt: np.ndarray
    loc: np.ndarray

    @staticmethod
    def of(size: int) -> "_Accesses":
        return _Accesses(np.full(size, -1, dtype=np.int64), *(np.zeros(size, dtype=np.int64)
                                                               for _ in range(3)))

    def who_now(self, cells: np.ndarray, epoch: int) -> np.ndarray:
        """The accessor of each of ``cells`` in ``epoch`` (NONE where none)."""
        return np.where(self.epoch[cells] == epoch, self.who[cells], NONE)

    def record(self, cells, old, who, epoch: int, stmt: int, loc: int) -> None:
        """Add ``who``'s accesses to ``old`` (``who_now``); ``stmt`` stays the first statement of
        an accessor's accesses (``EVERY``'s are one access only within one statement)."""
        self.stmt[cells] = np.where(old == who, self.stmt[cells], stmt)
        self.who[cells] = np.where(old == NONE, who, np.where(old == who, old, MANY))
        self.epoch[cells], self.loc[cells] = epoch, loc


@dataclass
class _Elements:
    writes: _Accesses
    reads: _Accesses
    atomic: np.ndarray      # every write of the element in its epoch was an atomic add


class ThreadRaces:
    def __init__(self, threads: int):
        self.threads = threads
        self.who: Who = EVERY
        self._stmt = 0
        self._epoch = 0
        self._shape: tuple[int, ...] = (threads,)    # thread extents, slowest first (z, y, x)
        self._buffers: dict[str, _Elements] = {}
        self._locs: list[ir.Loc] = []
        self._loc_ids: dict[ir.Loc, int] = {}

    # -- accessors ---------------------------------------------------------------------------
    def statement(self, who: Who) -> None:
        """The statement about to run, and who runs it."""
        self._stmt += 1
        self.who = who

    def thread_ids(self, extents: Sequence[int], lanes: Sequence[np.ndarray]) -> np.ndarray:
        """The thread of each iteration of a per-thread ``Parallel`` (its vars' lane arrays): its
        thread dims are the shortest prefix of its extents holding the block's threads."""
        rank = next((r for r in range(1, len(extents) + 1)
                     if math.prod(extents[:r]) == self.threads), None)
        if rank is None:
            raise RuntimeError(f"internal: a per-thread Parallel of extents {tuple(extents)} does "
                               f"not cover the block's {self.threads} threads")
        self._shape = tuple(extents[:rank])
        tid = np.zeros((), dtype=np.int64)
        for lane, n in zip(lanes[:rank], self._shape):
            tid = tid * n + lane
        return tid

    def sync(self) -> None:
        """A block barrier: every access before it is ordered before every access after it."""
        self._epoch += 1

    # -- accesses ----------------------------------------------------------------------------
    def access(self, buf: ir.Buffer, idx: Sequence[np.ndarray], active: Optional[np.ndarray],
               write: bool, atomic: bool, loc: ir.Loc) -> None:
        """Element lanes (broadcast index arrays, ``active`` None for all) by the current
        accessor."""
        who = self.who
        parts = list(idx) + ([] if active is None else [active]) + \
            ([who] if isinstance(who, np.ndarray) else [])
        shape = np.broadcast_shapes(*(np.shape(p) for p in parts))
        flat = np.ravel_multi_index(tuple(np.broadcast_to(i, shape) for i in idx),
                                    buf.static_shape).ravel()
        keep = None if active is None else np.broadcast_to(active, shape).ravel()
        if isinstance(who, np.ndarray):
            who = np.broadcast_to(who, shape).ravel()
            if keep is not None:
                who = who[keep]
        if keep is not None:
            flat = flat[keep]
        self._check(buf, flat, who, write, atomic, loc)

    def box(self, buf: ir.Buffer, box: tuple[tuple[int, int], ...], write: bool,
            atomic: bool, loc: ir.Loc) -> None:
        """A box of elements by the current accessor (a tile operation's region)."""
        grid = np.ix_(*(np.arange(lo, hi) for lo, hi in box))
        flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*grid)), buf.static_shape).ravel()
        self._check(buf, flat, self.who, write, atomic, loc)

    def _check(self, buf: ir.Buffer, flat: np.ndarray, who: Who, write: bool, atomic: bool,
               loc: ir.Loc) -> None:
        if flat.size == 0:
            return
        cells, first, last = _per_element(flat, who)
        if write and not atomic and (first != last).any():
            k = int(np.argmax(first != last))
            self._race(buf, cells[k], "write", int(last[k]), loc, "write", int(first[k]), loc)
        who_ = np.where(first == last, first, MANY)
        e = self._buffers.get(buf.name)
        if e is None:
            size = math.prod(buf.static_shape)
            e = self._buffers[buf.name] = _Elements(_Accesses.of(size), _Accesses.of(size),
                                                    np.zeros(size, dtype=bool))
        kind = "atomic add" if atomic else "write" if write else "read"
        writer = e.writes.who_now(cells, self._epoch)
        bad = (writer != NONE) & ~self._ordered(writer, e.writes.stmt[cells], who_)
        if write:
            bad &= ~(atomic & e.atomic[cells])
        else:       # a thread reading what every thread wrote alike reads its own write
            bad &= ~((writer == EVERY) & (who_ != BLOCK))
        if bad.any():
            k = int(np.argmax(bad))
            earlier = "atomic add" if e.atomic[cells[k]] else "write"
            self._race(buf, cells[k], kind, _other(first[k], last[k], writer[k]), loc, earlier,
                       int(writer[k]), self._locs[e.writes.loc[cells[k]]])
        if write:
            reader = e.reads.who_now(cells, self._epoch)
            bad = (reader != NONE) & ~self._ordered(reader, e.reads.stmt[cells], who_)
            if bad.any():
                k = int(np.argmax(bad))
                self._race(buf, cells[k], kind, _other(first[k], last[k], reader[k]), loc, "read",
                           int(reader[k]), self._locs[e.reads.loc[cells[k]]])
            e.atomic[cells] = np.where(writer == NONE, atomic, e.atomic[cells] & atomic)
            e.writes.record(cells, writer, who_, self._epoch, self._stmt, self._loc_id(loc))
        else:
            e.reads.record(cells, e.reads.who_now(cells, self._epoch), who_, self._epoch,
                           self._stmt, self._loc_id(loc))

    def _ordered(self, old: np.ndarray, old_stmt: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Recorded accesses ``old`` ordered before ``new`` by the accessor itself: one thread's,
        or one statement's ``EVERY``/``BLOCK``."""
        same = old == new
        return same & ((new >= 0) | (((new == EVERY) | (new == BLOCK)) & (old_stmt == self._stmt)))

    def _loc_id(self, loc: ir.Loc) -> int:
        n = self._loc_ids.get(loc)
        if n is None:
            n = self._loc_ids[loc] = len(self._locs)
            self._locs.append(loc)
        return n

    # -- messages ----------------------------------------------------------------------------
    def _race(self, buf: ir.Buffer, cell, kind: str, who: int, loc: ir.Loc, earlier: str,
              other: int, other_loc: ir.Loc):
        element = [int(i) for i in np.unravel_index(int(cell), buf.static_shape)]
        raise RaceError(at(loc, f"data race on shared buffer '{buf.name}': the {kind} of element "
                                f"{element} by {self._who_text(who)} is not ordered by a block "
                                f"barrier (T.sync_threads) with the {earlier} of it by "
                                f"{self._who_text(other)} at {other_loc}"))

    def _who_text(self, who: int) -> str:
        if who == EVERY:
            return "every thread (a statement all threads run alike)"
        if who == BLOCK:
            return "the block's threads together (a tile operation)"
        if who == MANY:
            return "several threads"
        coords = np.unravel_index(who, self._shape)[::-1]
        if len(coords) == 1:
            return f"thread {who}"
        return f"thread {who} ({', '.join(f'{d}={int(c)}' for d, c in zip('xyz', coords))})"


def _per_element(flat: np.ndarray, who: Who) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The elements accessed, and the smallest and largest accessor of each."""
    if not isinstance(who, np.ndarray):
        cells = np.unique(flat)
        same = np.full(cells.shape, who, dtype=np.int64)
        return cells, same, same
    order = np.lexsort((who, flat))
    flat, who = flat[order], who[order]
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])
    return flat[starts], np.minimum.reduceat(who, starts), np.maximum.reduceat(who, starts)


def _other(first, last, recorded) -> int:
    """Of the threads ``first``..``last`` accessing an element, one other than ``recorded``."""
    return int(last if first == recorded else first)
