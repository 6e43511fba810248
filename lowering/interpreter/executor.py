"""Executes the statements of one role: a generator that yields at every scheduling point.

Contract (the meaning of each statement; tile-level, thread-agnostic):
* Scheduling points: before every barrier operation (arrive, wait, asynchronous copy) and every
  statement touching shared memory; a statement between two points runs atomically.
* ``Alloc`` gives the buffer fresh (poisoned) storage or fresh mbarriers.
* ``PointerView`` views the memory at its evaluated address with its evaluated shape and
  strides (``addresses.AddressSpace``, the launch's), as a global buffer of this block.
* ``Copy``: region to region (unit dims squeezed), cast to the destination dtype. With
  ``barrier=`` (global -> shared) it is asynchronous: it reads the source and registers its bytes
  as expected transactions on the barrier's current phase at issue; the data lands at a later
  point chosen by the scheduler, decrementing the transaction count.
* ``Gemm``: C (+)= op(A) @ op(B), accumulated in C's value dtype (``values.Numerics``); float32
  operands are multiplied exactly whatever ``Gemm.precision`` says (TF32 permits rounding, never asks it).
* ``Fill``, ``Reduce`` (``clear=False`` combines with dst), ``CumSum`` (float sums in float32 at
  least, rounded once to dst's dtype), ``Store``, ``AtomicAdd`` (element
  and tile forms, bounds-masked; lanes hitting one element all add; ``prev`` receives the value
  before the add; every ``order`` holds, since blocks run one statement at a time).
* ``Parallel`` runs vectorized over its extents: ``If`` inside is a lane mask; global loads and
  stores out of bounds read 0 / are dropped. When checking, a block-wide ``Parallel`` of more
  than one iteration is checked for races between its iterations (``iteration_races``).
* ``For`` of every kind runs sequentially; ``If`` outside ``Parallel`` takes one branch.
* ``BarrierArrive`` arrives with the role's thread count (releasing its clock); ``BarrierWait``
  blocks until the phase of that parity has completed, then acquires that phase's clock.
* In a block running per-thread code (``Block.threads`` set), each statement first tells the
  thread-level race tracker who runs it (``thread_races``: the threads of a per-thread
  ``Parallel``'s iterations; the block together for a tile operation; every thread alike
  otherwise), and a ``BlockSync`` ends its epoch. Elsewhere ``BlockSync`` is a no-op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from .. import ir
from ..protocol import wait_text
from ..traverse import buffers_read, buffers_written, walk
from .addresses import AddressSpace
from .barriers import Barriers, MBarrier
from .expressions import Evaluator, both
from .iteration_races import IterationRaces, suspects
from .memory import Memory, region_box
from .messages import at
from .races import Actor, RaceTracker
from .scheduler import SWITCH, Scheduler, Wait
from .thread_races import BLOCK, EVERY, ThreadRaces

_REDUCE = {ir.ReduceKind.MAX: (np.max, np.maximum), ir.ReduceKind.MIN: (np.min, np.minimum),
           ir.ReduceKind.SUM: (np.sum, np.add),
           ir.ReduceKind.ABSSUM: (lambda x, axis: np.sum(np.abs(x), axis=axis), np.add),
           ir.ReduceKind.ABSMAX: (lambda x, axis: np.max(np.abs(x), axis=axis), np.maximum)}


@dataclass
class Block:
    """The state the roles of one program instance share."""
    memory: Memory
    barriers: Barriers
    evaluator: Evaluator
    scheduler: Scheduler
    races: Optional[RaceTracker]
    addresses: AddressSpace = field(default_factory=AddressSpace)
    threads: Optional[ThreadRaces] = None    # races between threads, where code is per-thread
    # the buffers of each Parallel (by id) that could race, shared by the launch's blocks
    suspects: dict[int, set[str]] = field(default_factory=dict)


class RoleExecutor:
    def __init__(self, block: Block, name: str, threads: int):
        self.b = block
        self.mem = block.memory
        self.ev = block.evaluator
        self.num = block.evaluator.num
        self.threads = threads
        self.actor: Optional[Actor] = block.races.add_role(name) if block.races else None
        self.thread_races = block.threads
        self._shared_cache: dict[int, bool] = {}
        # statements that may yield (generators), and those that run straight through
        self._blocking = {ir.Seq: self._seq, ir.For: self._for, ir.If: self._if,
                          ir.BarrierArrive: self._arrive, ir.BarrierWait: self._wait}
        self._straight = {ir.Alloc: self._alloc, ir.PointerView: self._pointer_view, ir.Copy: self._copy, ir.Gemm: self._gemm,
                          ir.Fill: self._fill, ir.Reduce: self._reduce, ir.CumSum: self._cumsum,
                          ir.Parallel: self._parallel, ir.Store: self._store,
                          ir.AtomicAdd: self._atomic_add,
                          # gemms run synchronously here, and shared memory has one proxy
                          ir.GemmWait: _no_op, ir.BulkStoreWait: _no_op,
                          ir.ProxyFence: _no_op, ir.BlockSync: _no_op}

    def run(self, body: ir.Seq, env: dict) -> Iterator:
        self._resume()
        yield from self._seq(body, dict(env))
        if self.actor is not None:
            self.b.races.retire(self.actor)

    # -- scheduling ------------------------------------------------------------------------------
    def _resume(self) -> None:
        if self.actor is not None:
            self.b.races.current = self.actor

    def _point(self) -> Iterator:
        yield SWITCH
        self._resume()

    def _touches_shared(self, s: ir.Stmt) -> bool:
        """Whether ``s`` itself (a ``Parallel`` with its body; not the bodies of loops and
        branches) reads or writes shared memory."""
        hit = self._shared_cache.get(id(s))
        if hit is None:
            stmts = walk(s) if isinstance(s, ir.Parallel) else (s,)
            hit = any(b.scope is ir.Scope.SHARED for t in stmts
                      for b in buffers_read(t) + buffers_written(t))
            self._shared_cache[id(s)] = hit
        return hit

    # -- statements ------------------------------------------------------------------------------
    def _stmt(self, s: ir.Stmt, env: dict) -> Iterator:
        if self._touches_shared(s):
            yield from self._point()
        if self.thread_races is not None:
            self._runs(s)
        run = self._blocking.get(type(s))
        if run is not None:
            yield from run(s, env)
            return
        run = self._straight.get(type(s))
        if run is None:
            raise RuntimeError(at(s.loc, f"the interpreter cannot run {type(s).__name__} inside "
                                         f"a role"))
        run(s, env)

    def _runs(self, s: ir.Stmt) -> None:
        """Tell the thread-level race tracker who runs ``s`` (a per-thread ``Parallel`` names its
        threads when its lanes exist), or end its epoch at a ``BlockSync``."""
        if isinstance(s, ir.BlockSync):
            self.thread_races.sync()
            return
        tile = (isinstance(s, _TILE_OPS)
                or (isinstance(s, ir.Parallel) and s.vars and not s.per_thread)
                or (isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region)))
        self.thread_races.statement(BLOCK if tile else EVERY)

    def _seq(self, s: ir.Seq, env: dict) -> Iterator:
        for t in s.stmts:
            yield from self._stmt(t, env)

    def _for(self, s: ir.For, env: dict) -> Iterator:
        start, stop, step = (self.ev.index(x, env) for x in (s.start, s.stop, s.step))
        for i in range(start, stop, step):
            env[s.var] = np.int64(i)
            yield from self._seq(s.body, env)

    def _if(self, s: ir.If, env: dict) -> Iterator:
        yield from self._seq(s.then if bool(self.ev.eval(s.cond, env)) else s.orelse, env)

    def _alloc(self, s: ir.Alloc, env: dict) -> None:
        if s.buffer.scope is ir.Scope.BARRIER:
            self.b.barriers.allocate(s.buffer)
        else:
            self.mem.allocate(s.buffer)

    def _pointer_view(self, s: ir.PointerView, env: dict) -> None:
        b = s.buffer
        address = int(self.ev.eval(s.address, env)) & ((1 << 64) - 1)
        shape = [self.ev.index(d, env) for d in b.shape]
        strides = [self.ev.index(x, env) for x in s.strides]
        self.mem.bind(b, self.b.addresses.view(address, shape, strides, b.dtype, s.loc))

    # -- barriers --------------------------------------------------------------------------------
    def _barrier(self, ref: ir.BarrierRef, env: dict, loc: ir.Loc) -> MBarrier:
        return self.b.barriers.get(ref.buffer, self.ev.index(ref.index, env), loc)

    def _arrive(self, s: ir.BarrierArrive, env: dict) -> Iterator:
        yield from self._point()
        clock = self.b.races.release(self.actor) if self.actor is not None else None
        self._barrier(s.barrier, env, s.loc).arrive(self.threads, clock)

    def _wait(self, s: ir.BarrierWait, env: dict) -> Iterator:
        bar = self._barrier(s.barrier, env, s.loc)
        parity = self.ev.index(s.parity, env) & 1
        yield Wait(lambda: bar.passes(parity),
                   lambda: wait_text(s.loc, parity, bar.name, bar.index, bar.describe()))
        self._resume()
        if self.actor is not None:
            self.b.races.acquire(self.actor, bar.released(parity))

    # -- tiles -----------------------------------------------------------------------------------
    def _starts(self, r: ir.Region, env: dict) -> list[int]:
        return [self.ev.index(x, env) for x in r.starts]

    def _read(self, r: ir.Region, env: dict, loc: ir.Loc) -> np.ndarray:
        """The region as a tile (unit dims squeezed)."""
        data = self.mem.read_box(r.buffer, self._starts(r, env), r.extents, loc)
        return data.reshape(r.tile_shape)

    def _write(self, r: ir.Region, env: dict, tile, loc: ir.Loc) -> None:
        data = np.asarray(tile)
        if data.ndim:
            data = data.reshape(r.extents)
        self.mem.write_box(r.buffer, self._starts(r, env), r.extents, data, loc)

    def _copy(self, s: ir.Copy, env: dict) -> None:
        if s.barrier is not None:
            self._async_copy(s, env)
            return
        self._write(s.dst, env, self._read(s.src, env, s.loc), s.loc)

    def _async_copy(self, s: ir.Copy, env: dict) -> None:
        bar = self._barrier(s.barrier, env, s.loc)
        data = self._read(s.src, env, s.loc).reshape(s.dst.extents)
        starts = self._starts(s.dst, env)
        nbytes = int(np.prod(s.dst.extents)) * s.dst.buffer.dtype.itemsize
        bar.expect_tx(nbytes)
        clock = None
        if self.actor is not None:
            lane = ("async copies", self.actor.key, bar.name, bar.index)
            clock = self.b.races.issue_async(s.dst.buffer, region_box(starts, s.dst.extents),
                                             s.loc, self.actor, lane)

        def land() -> None:
            self.mem.write_box(s.dst.buffer, starts, s.dst.extents, data, s.loc, observe=False)
            bar.complete_tx(nbytes, clock)

        self.b.scheduler.post(f"land {s.dst.buffer.name} (line {s.loc.line})", land)

    def _gemm(self, s: ir.Gemm, env: dict) -> None:
        acc = self.num.value(s.c.buffer.dtype)
        a = self._read(s.a, env, s.loc).astype(acc)
        b = self._read(s.b, env, s.loc).astype(acc)
        c = (a.T if s.transpose_a else a) @ (b.T if s.transpose_b else b)
        if not (s.clear_accum or s.clear_if is not None and self.ev.eval(s.clear_if, env)):
            c = c + self._read(s.c, env, s.loc)
        self._write(s.c, env, self.num.round(c, s.c.buffer.dtype), s.loc)

    def _fill(self, s: ir.Fill, env: dict) -> None:
        self._write(s.dst, env, self.ev.eval(s.value, env), s.loc)

    def _reduce(self, s: ir.Reduce, env: dict) -> None:
        reduce, combine = _REDUCE[s.kind]
        src = self.mem.read_box(s.src, [0] * len(s.src.shape), s.src.static_shape, s.loc)
        shape = s.dst.static_shape
        out = reduce(src.astype(self.num.value(s.dst.dtype)), axis=s.dim).reshape(shape)
        zeros = [0] * len(shape)
        if not s.clear:
            out = combine(out, self.mem.read_box(s.dst, zeros, shape, s.loc))
        self.mem.write_box(s.dst, zeros, shape, self.num.round(out, s.dst.dtype), s.loc)

    def _cumsum(self, s: ir.CumSum, env: dict) -> None:
        shape = s.src.static_shape
        src = self.mem.read_box(s.src, [0] * len(shape), shape, s.loc)
        x = src.astype(self.num.value(s.dst.dtype))     # float32 at least; integers in 64 bits
        if s.reverse:
            out = np.flip(np.cumsum(np.flip(x, s.dim), axis=s.dim), s.dim)
        else:
            out = np.cumsum(x, axis=s.dim)
        self.mem.write_box(s.dst, [0] * len(shape), shape, self.num.round(out, s.dst.dtype), s.loc)

    def _atomic_add(self, s: ir.AtomicAdd, env: dict, mask: Optional[np.ndarray] = None) -> None:
        dst = s.dst
        if isinstance(s.value, ir.Region):
            values = self._read(s.value, env, s.loc).reshape(dst.extents)
            grid = np.indices(dst.extents, sparse=True)
            idx = [g + st for g, st in zip(grid, self._starts(dst, env))]
        else:
            values = self.ev.eval(s.value, env, mask)
            idx = [self.ev.eval(x, env, mask) for x in dst.starts]
        if s.prev is not None:      # one add per block: a block runs one statement at a time
            self.mem.scatter(s.prev, [0], self.mem.gather(dst.buffer, idx, None, s.loc), None, s.loc)
        self.mem.atomic_add(dst.buffer, idx, values, mask, s.loc)

    # -- element-wise ----------------------------------------------------------------------------
    def _parallel(self, s: ir.Parallel, env: dict) -> None:
        lanes = dict(env)
        rank = len(s.vars)
        for d, (v, n) in enumerate(zip(s.vars, s.extents)):
            lanes[v] = np.arange(n, dtype=np.int64).reshape([n if k == d else 1 for k in range(rank)])
        if s.per_thread and self.thread_races is not None:
            tracker = self.thread_races
            tracker.statement(tracker.thread_ids(s.extents, [lanes[v] for v in s.vars]))
        races = self._iteration_races(s)
        self.mem.iterations = races
        try:
            self._lanes(s.body, lanes, None)
        finally:
            self.mem.iterations = None
        if races is not None:
            races.finish()

    def _iteration_races(self, s: ir.Parallel) -> Optional[IterationRaces]:
        """A tracker for this run of a block-wide ``Parallel`` that could race (when checking)."""
        if s.per_thread or not self.mem.check or math.prod(s.extents) < 2:
            return None
        watched = self.b.suspects.get(id(s))
        if watched is None:
            watched = self.b.suspects[id(s)] = suspects(s)
        return IterationRaces(s, watched) if watched else None

    def _lanes(self, body: ir.Seq, env: dict, mask: Optional[np.ndarray]) -> None:
        for t in body.stmts:
            if isinstance(t, ir.Store):
                self._store(t, env, mask)
            elif isinstance(t, ir.AtomicAdd):
                self._atomic_add(t, env, mask)
            elif isinstance(t, ir.If):
                cond = np.asarray(self.ev.eval(t.cond, env, mask), dtype=bool)
                self._lanes(t.then, env, both(mask, cond))
                self._lanes(t.orelse, env, both(mask, ~cond))
            else:
                raise RuntimeError(at(t.loc, f"the interpreter cannot run {type(t).__name__} "
                                             f"inside T.Parallel"))

    def _store(self, s: ir.Store, env: dict, mask: Optional[np.ndarray] = None) -> None:
        idx = [self.ev.eval(i, env, mask) for i in s.indices]
        value = self.ev.eval(s.value, env, mask)
        self.mem.scatter(s.buffer, idx, value, mask, s.loc)


_TILE_OPS = (ir.Copy, ir.Gemm, ir.Fill, ir.Reduce, ir.CumSum)     # run by the block together


def _no_op(s: ir.Stmt, env: dict) -> None:
    return None
