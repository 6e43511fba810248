"""The memory of one program instance (block): global views, on-chip buffers, written masks.

Contract:
* Global buffers are numpy views of the caller's tensors (always initialized), or of the memory
  at an address a ``PointerView`` bound (``bind``; ``addresses``). ``allocate`` gives
  a shared/fragment/local buffer fresh storage (``values.Numerics.held`` dtype) filled with the
  poison value and, when checking, an all-False written mask.
* Boxes (``read_box`` / ``write_box``: evaluated starts + static extents) and element lanes
  (``gather`` / ``scatter`` / ``atomic_add``: evaluated index arrays, broadcast together with the
  values and an optional ``active`` lane mask) are the two ways in.
* Out of bounds: global loads read 0 and global stores are dropped; an active on-chip access out
  of bounds is an ``OutOfBoundsError`` at the statement's line.
* When checking, reading an on-chip element nothing wrote raises ``UninitializedReadError`` naming
  the buffer, the element and the line; every shared-memory access is first reported to
  ``observer.access(buf, box, write, loc)`` (race detection between roles) and, in a block running
  per-thread code, element by element to ``threads`` (``thread_races.ThreadRaces``: races between
  its threads), unless ``observe=False``; while a block-wide ``Parallel`` runs, its element
  lanes are reported to ``iterations`` (``iteration_races.IterationRaces``: races between its
  iterations).
* When checking a kernel with a ``SharedMemoryPlan``, shared buffers live in one byte arena at
  their planned offsets (``SharedArena``): each write records its buffer as the owner of the
  bytes it covers, and reading bytes another buffer wrote since (the plan put two live buffers
  on the same bytes) raises ``SharedOverlapError`` naming both buffers and the line.
* Reads return values in the value dtype (``Numerics.value``); writes round to the held dtype.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from .. import ir
from ..errors import OutOfBoundsError, SharedOverlapError, UninitializedReadError
from .iteration_races import IterationRaces
from .messages import at
from .thread_races import ThreadRaces
from .values import Numerics, poison, to_storage

Box = tuple[tuple[int, int], ...]


def region_box(starts: Sequence[int], extents: Sequence[int]) -> Box:
    return tuple((s, s + e) for s, e in zip(starts, extents))


class SharedArena:
    """The block's shared bytes as the plan places them: which buffer last wrote each byte."""

    def __init__(self, plan):
        self.ranges = {n: (o, b) for n, o, b in plan.ranges}
        self.names = [n for n, _, _ in plan.ranges]
        self.owner = np.full(plan.total_bytes, -1, dtype=np.int32)
        self._elements: dict[str, np.ndarray] = {}

    def add(self, buf: ir.Buffer) -> None:
        if buf.name in self.ranges:
            self._elements[buf.name] = np.arange(math.prod(buf.static_shape)).reshape(buf.static_shape)

    def _bytes(self, buf: ir.Buffer, where) -> np.ndarray:
        first = self.ranges[buf.name][0] + self._elements[buf.name][where].ravel() * buf.dtype.itemsize
        return first[:, None] + np.arange(buf.dtype.itemsize)

    def wrote(self, buf: ir.Buffer, where) -> None:
        if buf.name in self._elements:
            self.owner[self._bytes(buf, where)] = self.names.index(buf.name)

    def check_read(self, buf: ir.Buffer, where, loc: ir.Loc) -> None:
        if buf.name not in self._elements:
            return
        me = self.names.index(buf.name)
        owners = self.owner[self._bytes(buf, where)]
        other = (owners != me) & (owners >= 0)
        if other.any():
            thief = self.names[int(owners[other][0])]
            (o, n), (p, m) = self.ranges[buf.name], self.ranges[thief]
            raise SharedOverlapError(at(loc, (
                f"read of shared buffer '{buf.name}' finds bytes '{thief}' wrote: the shared-memory "
                f"plan puts both on the same bytes ('{buf.name}' at [{o}, {o + n}), '{thief}' at "
                f"[{p}, {p + m})) while '{buf.name}' is still live, so this read sees '{thief}''s "
                f"data (the plan's lifetimes are wrong)")))


class Memory:
    def __init__(self, globals_: dict[str, np.ndarray], numerics: Numerics, check: bool,
                 observer=None, arena: Optional[SharedArena] = None,
                 threads: Optional[ThreadRaces] = None):
        self.num = numerics
        self.check = check
        self.observer = observer
        self.threads = threads
        self.iterations: Optional[IterationRaces] = None
        self.arena = arena if check else None
        self._arrays = dict(globals_)
        self._written: dict[str, np.ndarray] = {}

    # -- buffers -------------------------------------------------------------------------------
    def allocate(self, buf: ir.Buffer) -> None:
        held = self.num.held(buf)
        self._arrays[buf.name] = np.full(buf.static_shape, poison(held), dtype=held)
        if self.check:
            self._written[buf.name] = np.zeros(buf.static_shape, dtype=bool)
        if self.arena is not None and buf.scope is ir.Scope.SHARED:
            self.arena.add(buf)

    def bind(self, buf: ir.Buffer, array: np.ndarray) -> None:
        """Global ``buf`` is ``array`` from now on in this block (``ir.PointerView``)."""
        self._arrays[buf.name] = array

    def array(self, buf: ir.Buffer, loc: ir.Loc) -> np.ndarray:
        arr = self._arrays.get(buf.name)
        if arr is None:
            raise RuntimeError(at(loc, f"buffer '{buf.name}' is used before its allocation runs"))
        return arr

    # -- boxes -----------------------------------------------------------------------------------
    def read_box(self, buf: ir.Buffer, starts: Sequence[int], extents: Sequence[int],
                 loc: ir.Loc) -> np.ndarray:
        arr = self.array(buf, loc)
        value = self.num.value(buf.dtype)
        if buf.scope is ir.Scope.GLOBAL:
            out = np.zeros(tuple(extents), dtype=value)
            clipped = _clip(starts, extents, arr.shape)
            if clipped is not None:
                inner, outer = clipped
                out[outer] = arr[inner]
            return out
        inner = self._on_chip(buf, arr, starts, extents, loc)
        self._observe(buf, region_box(starts, extents), False, loc)
        if self.check:
            written = self._written[buf.name][inner]
            if not written.all():
                first = tuple(int(i) + s for i, s in zip(np.argwhere(~written)[0], starts))
                self._uninitialized(buf, first, loc)
        self._check_owner(buf, inner, loc)
        return arr[inner].astype(value)

    def write_box(self, buf: ir.Buffer, starts: Sequence[int], extents: Sequence[int], data,
                  loc: ir.Loc, observe: bool = True) -> None:
        arr = self.array(buf, loc)
        data = np.broadcast_to(to_storage(data, arr.dtype), tuple(extents))
        if buf.scope is ir.Scope.GLOBAL:
            clipped = _clip(starts, extents, arr.shape)
            if clipped is not None:
                inner, outer = clipped
                arr[inner] = data[outer]
            return
        inner = self._on_chip(buf, arr, starts, extents, loc)
        if observe:
            self._observe(buf, region_box(starts, extents), True, loc)
        arr[inner] = data
        if self.check:
            self._written[buf.name][inner] = True
        self._owns(buf, inner)

    def _on_chip(self, buf, arr, starts, extents, loc) -> tuple[slice, ...]:
        for d, (s, e, n) in enumerate(zip(starts, extents, arr.shape)):
            if s < 0 or s + e > n:
                raise OutOfBoundsError(at(loc, f"region [{s}:{s + e}] of dimension {d} is outside "
                                         f"{buf.scope.value} buffer '{buf.name}' (extent {n})"))
        return tuple(slice(s, s + e) for s, e in zip(starts, extents))

    # -- element lanes ---------------------------------------------------------------------------
    def gather(self, buf: ir.Buffer, idx: Sequence, active: Optional[np.ndarray],
               loc: ir.Loc) -> np.ndarray:
        arr, lanes, act = self._lanes(buf, idx, active, loc, False)
        vals = arr[lanes].astype(self.num.value(buf.dtype))
        return vals if act is None else np.where(act, vals, vals.dtype.type(0))

    def scatter(self, buf: ir.Buffer, idx: Sequence, values, active: Optional[np.ndarray],
                loc: ir.Loc) -> None:
        arr, lanes, act = self._lanes(buf, idx, active, loc, True, np.shape(values))
        values = to_storage(values, arr.dtype)
        if act is None:
            arr[lanes] = np.broadcast_to(values, lanes[0].shape)
            picked = lanes
        else:
            picked = tuple(i[act] for i in lanes)
            arr[picked] = np.broadcast_to(values, act.shape)[act]
        if self.check and buf.scope is not ir.Scope.GLOBAL:
            self._written[buf.name][picked] = True
        self._owns(buf, picked)

    def atomic_add(self, buf: ir.Buffer, idx: Sequence, values, active: Optional[np.ndarray],
                   loc: ir.Loc) -> None:
        """``buf[idx] += values`` lane by lane; lanes hitting one element all add (in float64 /
        int64, rounded once)."""
        arr, lanes, act = self._lanes(buf, idx, active, loc, True, np.shape(values), atomic=True)
        act = np.ones(lanes[0].shape, dtype=bool) if act is None else act
        if buf.scope is not ir.Scope.GLOBAL:
            self._check_written(buf, lanes, act, loc)
        picked = tuple(i[act] for i in lanes)
        self._check_owner(buf, picked, loc)
        self._owns(buf, picked)
        flat = np.ravel_multi_index(tuple(i[act] for i in lanes), arr.shape)
        wide = np.float64 if buf.dtype.is_float else np.int64
        add = np.broadcast_to(np.asarray(values), act.shape)[act].astype(wide)
        cells, which = np.unique(flat, return_inverse=True)
        sums = np.zeros(len(cells), dtype=wide)
        np.add.at(sums, which, add)
        pos = np.unravel_index(cells, arr.shape)
        arr[pos] = to_storage(self.num.round(arr[pos].astype(wide) + sums, buf.dtype), arr.dtype)

    def _lanes(self, buf, idx, active, loc, write: bool, values_shape: tuple = (),
               atomic: bool = False):
        """Broadcast indices, mask and values' shape; bounds-check; report the access; check
        initialization. Returns (array, safe index arrays, active lanes or None for all)."""
        arr = self.array(buf, loc)
        idx = [np.asarray(i, dtype=np.int64) for i in idx]
        shape = np.broadcast_shapes(*(i.shape for i in idx), np.shape(active), values_shape)
        idx = [np.broadcast_to(i, shape) for i in idx]
        inside = np.ones(shape, dtype=bool)
        for i, n in zip(idx, arr.shape):
            inside &= (i >= 0) & (i < n)
        if active is not None:
            active = np.broadcast_to(active, shape)
        outside = ~inside if active is None else active & ~inside
        if buf.scope is not ir.Scope.GLOBAL and outside.any():
            bad = [int(i[outside][0]) for i in idx]
            raise OutOfBoundsError(at(loc, f"index {bad} is outside {buf.scope.value} buffer "
                                     f"'{buf.name}' (shape {list(arr.shape)})"))
        act = inside if active is None else inside & active
        if act.all():
            lanes, act = tuple(idx), None
        else:
            lanes = tuple(np.where(act, i, 0) for i in idx)
        if self.iterations is not None:
            self.iterations.access(buf, arr.shape, lanes, act, write, atomic, loc)
        if buf.scope is ir.Scope.SHARED and (act is None or act.any()):
            if self.observer is not None:
                picked = lanes if act is None else tuple(i[act] for i in lanes)
                self.observer.access(buf, tuple((int(i.min()), int(i.max()) + 1) for i in picked),
                                     write, loc)
            if self.threads is not None:
                self.threads.access(buf, lanes, act, write, atomic, loc)
        if not write and buf.scope is not ir.Scope.GLOBAL:
            self._check_written(buf, lanes, act, loc)
            self._check_owner(buf, lanes if act is None else tuple(i[act] for i in lanes), loc)
        return arr, lanes, act

    # -- checks ----------------------------------------------------------------------------------
    def _owns(self, buf: ir.Buffer, where) -> None:
        if self.arena is not None and buf.scope is ir.Scope.SHARED:
            self.arena.wrote(buf, where)

    def _check_owner(self, buf: ir.Buffer, where, loc: ir.Loc) -> None:
        if self.arena is not None and buf.scope is ir.Scope.SHARED:
            self.arena.check_read(buf, where, loc)

    def _check_written(self, buf, lanes, act, loc) -> None:
        if not self.check:
            return
        bad = ~self._written[buf.name][lanes]
        if act is not None:
            bad &= act
        if bad.any():
            self._uninitialized(buf, tuple(int(i[bad][0]) for i in lanes), loc)

    def _uninitialized(self, buf: ir.Buffer, index: tuple, loc: ir.Loc):
        hint = ""
        if buf.scope is ir.Scope.SHARED:
            hint = (" (if another role or an asynchronous copy writes it, this read is not "
                    "ordered after that write by a barrier wait)")
        raise UninitializedReadError(at(loc, f"read of uninitialized {buf.scope.value} buffer "
                                             f"'{buf.name}' at index {list(index)}: nothing wrote "
                                             f"it before this read{hint}"))

    def _observe(self, buf: ir.Buffer, box: Box, write: bool, loc: ir.Loc) -> None:
        if buf.scope is not ir.Scope.SHARED:
            return
        if self.observer is not None:
            self.observer.access(buf, box, write, loc)
        if self.threads is not None:
            self.threads.box(buf, box, write, False, loc)


def _clip(starts, extents, shape):
    """(slices into the array, slices into the box) of the in-bounds part, or None if empty."""
    inner, outer = [], []
    for s, e, n in zip(starts, extents, shape):
        lo, hi = max(s, 0), min(s + e, n)
        if hi <= lo:
            return None
        inner.append(slice(lo, hi))
        outer.append(slice(lo - s, hi - s))
    return tuple(inner), tuple(outer)
