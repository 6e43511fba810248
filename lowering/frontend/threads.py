"""The thread level: per-thread statements of a kernel body -> block-wide Tile IR.

A kernel body runs on ``threads`` threads. Statements outside ``T.Parallel`` and tile operations
run per thread; where they read no thread index they compute the same in every thread, which is
what tile-level code always meant (once per block). This module finds the statements that differ
between threads and gives them the Tile IR form every pass, the interpreter and every backend
already know: a ``Parallel(per_thread=True)`` over the thread dimensions.

Contract (``lower``):
* Input: a kernel body as the visitor built it. Expressions outside ``T.Parallel`` may read thread
  indices (``VarKind.THREAD`` vars, ``thread_vars[d]`` for dimension d of ``thread_shape``, x first).
* An expression is *per-thread* if it reads a thread index or a per-thread local. A local buffer
  (``T.alloc_local``, ``T.alloc_var``) is per-thread if a store into it is: a per-thread value or
  index, or any store under per-thread control (a branch on a per-thread condition, a loop with
  per-thread bounds). Everything else is *uniform* and keeps its meaning and form.
* A per-thread local becomes a fragment with the thread dimensions in front: ``(z, y, x) + shape``;
  every access to it gains the thread's indices.
* Per-thread stores and element atomics become ``Parallel(per_thread=True)`` statements over the
  thread dimensions (z, y, x); consecutive ones share one unless a later one touches shared or
  global memory or a fragment (storage other threads see) an earlier one of the group writes
  (or writes what one reads), so that the barrier a backend needs between them has a place to
  stand (a thread reading another's element, as a shuffle does, reads it after every write).
* A branch on a per-thread condition becomes masks on the statements it holds (the condition is
  evaluated once, into a per-thread flag, where the branch writes something it reads). A loop with
  per-thread bounds runs from the block's smallest start to its largest stop, each thread's
  statements masked to its own iterations (the step must be uniform). A loop whose iterations are
  independent element stores (``T.vectorized``, or a loop with build-time bounds whose every store
  gives each iteration its own element and reads nothing the loop writes) becomes one more
  parallel dimension: of the per-thread ``Parallel`` for per-thread stores, of a block-wide one
  for uniform stores.
* ``T.fill``/``T.clear`` of a per-thread local is a block-wide fill of its fragment, or per-thread
  stores where it stands under per-thread control or fills a per-thread value.
* A uniform element store (or element atomic) outside ``T.Parallel`` into shared, fragment or
  global memory becomes a ``Parallel`` of one iteration (every thread writes the same value).
* Refused at the user's line: an element index of a local buffer that reads a thread index and can
  leave the buffer (known from the thread counts and the loops' build-time bounds), a tile operation or ``T.sync_threads`` under per-thread control (all
  threads run those together), a ``T.Parallel`` or tile operation reading a thread index or
  per-thread local (other than copies, fills and reductions of per-thread locals into per-thread
  locals, which act on the fragments), a per-thread loop step, ``return_prev`` in per-thread code.
* Output: no ``THREAD`` var remains; new buffers are allocated at the top of the body.
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import Callable, Optional, Sequence

from .. import ir
from ..errors import CompileError
from ..simplify import interval, linear, loop_range
from ..traverse import (buffers_read, buffers_written, element_accesses, exprs_of, footprint,
                        subexprs, substmts, transform, walk)

Fresh = Callable[[str], str]
_I32 = ir.DType.I32
_MEMORY = (ir.Scope.SHARED, ir.Scope.GLOBAL, ir.Scope.FRAGMENT)   # seen by other threads


def lower(body: list[ir.Stmt], thread_vars: dict[int, ir.Var], thread_shape: Sequence[int],
          vectorized: set, fresh: Fresh) -> list[ir.Stmt]:
    """The kernel body with every per-thread statement in block-wide form (module docstring)."""
    ranges = {v: (0, thread_shape[d] - 1) for d, v in thread_vars.items() if d < len(thread_shape)}
    _check_local_indices(body, ranges)
    lowering = _Lowering(body, thread_vars, tuple(thread_shape), vectorized, fresh)
    out = lowering.run(body)
    leftover = [v for s in out for t in walk(s) for e in exprs_of(t) for v in subexprs(e)
                if isinstance(v, ir.Var) and v.kind is ir.VarKind.THREAD]
    if leftover:
        raise CompileError(f"internal: thread index '{leftover[0].name}' left after the thread "
                           f"level was lowered", leftover[0].loc)
    return out


def linear_thread(indices: Sequence[Optional[ir.Expr]], counts: Sequence[int],
                  loc: ir.Loc) -> ir.Expr:
    """The linear index ``x + X * (y + Y * z)`` of the thread of (z, y, x) ``indices`` (None: 0)
    in a block of (z, y, x) ``counts``."""
    out: Optional[ir.Expr] = None
    for i, count in zip(indices, counts):
        if out is not None:
            out = ir.BinOp(ir.BinOpKind.MUL, out, _const(count, loc), _I32, loc)
        if i is not None:
            out = i if out is None else ir.BinOp(ir.BinOpKind.ADD, out, i, _I32, loc)
    return out if out is not None else _const(0, loc)


def _check_local_indices(stmts, ranges: dict) -> None:
    """Refuse, at its line, an element access of a local buffer whose index reads a thread index and
    can leave the buffer (``simplify.interval`` over the thread indices and the build-time bounds
    of the loops around it): a thread's registers have no neighbours to read (``v[(tx + 1) % 32]``
    on a 1-element local), and a backend would read nothing there without a word."""
    for s in stmts:
        for buf, indices in element_accesses(s):
            if buf.scope is not ir.Scope.LOCAL:
                continue
            for d, (i, size) in enumerate(zip(indices, buf.static_shape)):
                if not any(isinstance(x, ir.Var) and x.kind is ir.VarKind.THREAD for x in subexprs(i)):
                    continue            # (loop indices alone may be correlated: no false alarms)
                span = interval(i, ranges)
                if span is not None and (span[0] < 0 or span[1] >= size):
                    raise CompileError(f"index {d} of local '{buf.name}' (shape "
                                       f"{list(buf.static_shape)}) takes values {span[0]}..{span[1]}, "
                                       f"outside 0..{size - 1}: a local is one thread's own storage",
                                       _loc(s))
        inner = dict(ranges)
        span = loop_range(s, ranges) if isinstance(s, ir.For) else None
        if span is not None:
            inner[s.var] = span
        elif isinstance(s, ir.Parallel):
            inner.update((v, (0, n - 1)) for v, n in zip(s.vars, s.extents))
        for body in substmts(s):
            _check_local_indices(body.stmts, inner)


def _loc(s) -> ir.Loc:
    return getattr(s, "loc", ir.UNKNOWN_LOC)


# the conditions a per-thread statement runs under, outermost first: each is evaluated only where
# the ones before it hold (nested ``if``s), so a flag written under a branch is read under it
Mask = tuple


def _and(mask: Mask, cond: ir.Expr) -> Mask:
    return mask + (cond,)


def _not(e: ir.Expr) -> ir.Expr:
    return ir.UnOp(ir.UnOpKind.NOT, e, ir.DType.BOOL, e.loc)


def _const(v: int, loc: ir.Loc) -> ir.Const:
    return ir.Const(v, _I32, loc)


class _Lowering:
    def __init__(self, body, thread_vars, thread_shape, vectorized, fresh: Fresh):
        self.fresh = fresh
        self.vectorized = vectorized
        # thread dims slowest first: (z, y, x); the THREAD var of each (None: never asked for)
        rank = len(thread_shape)
        self.dims = tuple(reversed(range(rank)))
        self.extents = tuple(thread_shape[d] for d in self.dims)
        self.thread_var = {thread_vars[d]: i for i, d in enumerate(self.dims) if d in thread_vars}
        self.varying: set[ir.Buffer] = set()
        self.promoted: dict[ir.Buffer, ir.Buffer] = {}
        self.allocs: list[ir.Alloc] = []
        self._out: list[list[ir.Stmt]] = []
        self._run: list[tuple[ir.Stmt, Mask]] = []
        self._run_memory: tuple[set, set] = (set(), set())
        if self.thread_var:
            self._find_varying(body)

    # -- which values differ between threads -------------------------------------------------
    def is_varying(self, e: ir.Expr) -> bool:
        return any((isinstance(x, ir.Var) and x in self.thread_var)
                   or (isinstance(x, ir.Load) and x.buffer in self.varying) for x in subexprs(e))

    def _stmt_varying(self, s: ir.Stmt) -> bool:
        return (any(self.is_varying(e) for e in exprs_of(s))
                or any(b in self.varying for b in buffers_read(s) + buffers_written(s)))

    def _find_varying(self, body: list[ir.Stmt]) -> None:
        while self._mark(body, False):
            pass

    def _mark(self, stmts, control: bool) -> bool:
        changed = False
        for s in stmts:
            if isinstance(s, ir.If):
                c = control or self.is_varying(s.cond)
                changed |= self._mark(s.then.stmts, c) | self._mark(s.orelse.stmts, c)
            elif isinstance(s, ir.For):
                c = control or any(self.is_varying(e) for e in (s.start, s.stop, s.step))
                changed |= self._mark(s.body.stmts, c)
            elif isinstance(s, (ir.Role, ir.WarpSpecialize)):
                for body in substmts(s):
                    changed |= self._mark(body.stmts, control)
            elif not isinstance(s, ir.Parallel) and (control or self._stmt_varying(s)):
                for b in buffers_written(s):
                    if b.scope is ir.Scope.LOCAL and b not in self.varying:
                        self.varying.add(b)
                        changed = True
        return changed

    # -- output ------------------------------------------------------------------------------
    def run(self, body: list[ir.Stmt]) -> list[ir.Stmt]:
        with self._block() as out:
            self._seq(body, ())
        return self.allocs + out

    @contextmanager
    def _block(self):
        self._flush()
        self._out.append([])
        try:
            yield self._out[-1]
        finally:
            self._flush()
            self._out.pop()

    def _emit(self, s: ir.Stmt) -> None:
        self._flush()
        self._out[-1].append(s)

    def _add(self, s: ir.Stmt, mask: Mask) -> None:
        """A per-thread statement (thread indices and unpromoted locals still in it)."""
        reads, writes = footprint(s)
        reads = {b for b in reads if b.scope in _MEMORY}
        writes = {b for b in writes if b.scope in _MEMORY}
        run_reads, run_writes = self._run_memory
        if writes & (run_reads | run_writes) or reads & run_writes:
            self._flush()
            run_reads, run_writes = self._run_memory
        run_reads |= reads
        run_writes |= writes
        self._run.append((s, mask))

    def _flush(self) -> None:
        if not self._run:
            return
        stmts, self._run = self._run, []
        self._run_memory = (set(), set())
        self._out[-1].append(self._parallel([], [], stmts, per_thread=True))

    def _parallel(self, extra_vars: list[ir.Var], extra_extents: list[int],
                  stmts: list[tuple[ir.Stmt, Mask]], per_thread: bool) -> ir.Parallel:
        """A Parallel over the thread dims (``per_thread``) and then ``extra_vars`` (their
        fresh replacements bound), of ``stmts`` each under its mask."""
        loc = _loc(stmts[0][0])
        names = {i: v.name for v, i in self.thread_var.items()}
        tvars = tuple(ir.Var(self.fresh(names.get(i, "t" + "zyx"[-len(self.dims):][i])), _I32,
                             ir.VarKind.PARALLEL, loc) for i in range(len(self.dims))) if per_thread else ()
        evars = tuple(ir.Var(self.fresh(v.name), _I32, ir.VarKind.PARALLEL, loc) for v in extra_vars)
        rename = dict(zip(extra_vars, evars))
        groups: list[tuple[Mask, list[ir.Stmt]]] = []
        for s, mask in stmts:
            s = self._localize(s, tvars, rename)
            mask = tuple(self._localize(c, tvars, rename) for c in mask)
            if groups and groups[-1][0] == mask:
                groups[-1][1].append(s)
            else:
                groups.append((mask, [s]))
        body: list[ir.Stmt] = []
        for mask, group in groups:
            inner = tuple(group)
            where = _loc(inner[0])
            for cond in reversed(mask):
                inner = (ir.If(cond, ir.Seq(inner, where), ir.Seq((), where), where),)
            body.extend(inner)
        return ir.Parallel(tvars + evars, (self.extents if per_thread else ()) + tuple(extra_extents),
                           ir.Seq(tuple(body), loc), loc, per_thread)

    def _localize(self, node, tvars: tuple, rename: dict):
        """``node`` with thread indices and ``rename``'s vars replaced, and per-thread locals
        indexed by the thread (``tvars``)."""
        def fix(x):
            if isinstance(x, ir.Var):
                if x in self.thread_var:
                    if not tvars:
                        raise CompileError("internal: a thread index in block-wide code", x.loc)
                    return tvars[self.thread_var[x]]
                return rename.get(x)
            if isinstance(x, ir.Load) and x.buffer in self.promoted:
                return dataclasses.replace(x, buffer=self.promoted[x.buffer], indices=tvars + x.indices)
            if isinstance(x, ir.Store) and x.buffer in self.promoted:
                return dataclasses.replace(x, buffer=self.promoted[x.buffer], indices=tvars + x.indices)
            if isinstance(x, ir.Region) and x.buffer in self.promoted:
                return dataclasses.replace(x, buffer=self.promoted[x.buffer], starts=tvars + x.starts,
                                           extents=(1,) * len(tvars) + x.extents)
            return None
        return transform(node, fix)

    def _promote(self, buf: ir.Buffer) -> ir.Buffer:
        out = self.promoted.get(buf)
        if out is None:
            shape = tuple(_const(e, buf.loc) for e in self.extents) + buf.shape
            out = dataclasses.replace(buf, shape=shape, scope=ir.Scope.FRAGMENT)
            self.promoted[buf] = out
        return out

    def _whole(self, r: ir.Region) -> ir.Region:
        """A region of a per-thread local as the region of every thread's part of its fragment."""
        return dataclasses.replace(r, buffer=self.promoted[r.buffer],
                                   starts=tuple(_const(0, r.loc) for _ in self.extents) + r.starts,
                                   extents=self.extents + r.extents)

    def _local(self, shape: tuple[int, ...], dtype: ir.DType, name: str, loc: ir.Loc) -> ir.Buffer:
        """A fresh per-thread local (allocated at the top of the body)."""
        buf = ir.Buffer(self.fresh(name), tuple(_const(d, loc) for d in shape), dtype,
                        ir.Scope.LOCAL, (), loc)
        self.varying.add(buf)
        self.allocs.append(ir.Alloc(self._promote(buf), loc))
        return buf

    # -- statements --------------------------------------------------------------------------
    def _seq(self, stmts, mask: Mask) -> None:
        for s in stmts:
            self._stmt(s, mask)

    def _stmt(self, s: ir.Stmt, mask: Mask) -> None:
        if isinstance(s, ir.Seq):
            self._seq(s.stmts, mask)
        elif isinstance(s, ir.Alloc):
            buf = s.buffer
            self._emit(dataclasses.replace(s, buffer=self._promote(buf)) if buf in self.varying else s)
        elif isinstance(s, (ir.Store, ir.AtomicAdd)) and not isinstance(getattr(s, "value", None), ir.Region):
            self._element(s, mask)
        elif isinstance(s, ir.If):
            self._if(s, mask)
        elif isinstance(s, ir.For):
            self._for(s, mask)
        elif isinstance(s, ir.Fill) and s.dst.buffer in self.varying:
            self._fill(s, mask)
        else:
            self._block_wide(s, mask)

    def _element(self, s, mask: Mask) -> None:
        per_thread = bool(mask) or self._stmt_varying(s)
        if per_thread:
            if isinstance(s, ir.AtomicAdd) and s.prev is not None:
                raise CompileError("T.atomic_add(return_prev=True) in per-thread code is not "
                                   "supported: use it where every thread adds the same", s.loc)
            self._add(s, mask)
            return
        target = _target(s)
        if target.scope is ir.Scope.LOCAL or (isinstance(s, ir.AtomicAdd) and target.scope is ir.Scope.GLOBAL):
            self._emit(s)           # (an element atomic outside T.Parallel: one add per block)
        else:                       # every thread writes the same: one iteration, block-wide
            self._emit(self._parallel([], [], [(s, ())], per_thread=False))

    def _if(self, s: ir.If, mask: Mask) -> None:
        if not mask and not self.is_varying(s.cond):
            with self._block() as then:
                self._seq(s.then.stmts, ())
            with self._block() as orelse:
                self._seq(s.orelse.stmts, ())
            self._emit(dataclasses.replace(s, then=ir.Seq(tuple(then), s.then.loc),
                                           orelse=ir.Seq(tuple(orelse), s.orelse.loc)))
            return
        cond = s.cond
        _, writes = footprint(s.then, s.orelse)
        if any(isinstance(x, ir.Load) and x.buffer in writes for x in subexprs(cond)):
            flag = self._local((1,), ir.DType.BOOL, "cond", s.loc)
            self._add(ir.Store(flag, (_const(0, s.loc),), cond, s.loc), mask)
            cond = ir.Load(flag, (_const(0, s.loc),), s.loc)
        self._seq(s.then.stmts, _and(mask, cond))
        if s.orelse.stmts:
            self._seq(s.orelse.stmts, _and(mask, _not(cond)))

    def _for(self, s: ir.For, mask: Mask) -> None:
        if self.is_varying(s.step):
            raise CompileError("a loop's step must be the same in every thread (it reads a thread "
                               "index or a per-thread value)", s.loc)
        if self.is_varying(s.start) or self.is_varying(s.stop):
            self._ragged_for(s, mask)
            return
        if self._as_dimension(s, mask):
            return
        with self._block() as body:
            self._seq(s.body.stmts, mask)
        self._emit(dataclasses.replace(s, body=ir.Seq(tuple(body), s.body.loc)))

    def _ragged_for(self, s: ir.For, mask: Mask) -> None:
        """A loop whose bounds differ between threads: the block runs the union of the threads'
        iteration spaces; each thread's statements are masked to its own."""
        loc = s.loc
        zero = _const(0, loc)
        n = math.prod(self.extents)
        start = self._local((1,), _I32, f"{s.var.name}_start", loc)
        stop = self._local((1,), _I32, f"{s.var.name}_stop", loc)
        # a thread the loop does not run for (masked off) contributes an empty range
        self._add(ir.Store(start, (zero,), s.start, loc), ())
        self._add(ir.Store(stop, (zero,), s.start, loc), ())
        self._add(ir.Store(stop, (zero,), s.stop, loc), mask)
        lows, highs = (self._table(n, f"{s.var.name}_{what}", loc) for what in ("starts", "stops"))
        lin = self._linear_thread(loc)
        self._add(ir.Store(lows, (lin,), ir.Load(start, (zero,), loc), loc), ())
        self._add(ir.Store(highs, (lin,), ir.Load(stop, (zero,), loc), loc), ())
        low, high = (self._table(1, f"{s.var.name}_{what}", loc) for what in ("lo", "hi"))
        self._emit(ir.Reduce(ir.ReduceKind.MIN, lows, low, 0, True, loc))
        self._emit(ir.Reduce(ir.ReduceKind.MAX, highs, high, 0, True, loc))
        own = ir.BinOp(ir.BinOpKind.AND,
                       ir.Cmp(ir.CmpKind.GE, s.var, ir.Load(start, (zero,), loc), loc),
                       ir.Cmp(ir.CmpKind.LT, s.var, ir.Load(stop, (zero,), loc), loc), ir.DType.BOOL, loc)
        if ir.as_int(s.step) != 1:
            offset = ir.BinOp(ir.BinOpKind.SUB, s.var, ir.Load(start, (zero,), loc), _I32, loc)
            own = ir.BinOp(ir.BinOpKind.AND, own, ir.Cmp(
                ir.CmpKind.EQ, ir.BinOp(ir.BinOpKind.MOD, offset, s.step, _I32, loc), zero, loc),
                ir.DType.BOOL, loc)
        with self._block() as body:
            self._seq(s.body.stmts, (own,))       # masked-off threads have an empty range
        self._emit(dataclasses.replace(s, start=ir.Load(low, (zero,), loc),
                                       stop=ir.Load(high, (zero,), loc),
                                       body=ir.Seq(tuple(body), s.body.loc)))

    def _table(self, n: int, name: str, loc: ir.Loc) -> ir.Buffer:
        buf = ir.Buffer(self.fresh(name), (_const(n, loc),), _I32, ir.Scope.FRAGMENT, (), loc)
        self.allocs.append(ir.Alloc(buf, loc))
        return buf

    def _linear_thread(self, loc: ir.Loc) -> ir.Expr:
        """The thread's linear index, in THREAD vars (dims never asked for are 0)."""
        by_dim = {i: v for v, i in self.thread_var.items()}
        return linear_thread([by_dim.get(i) for i in range(len(self.extents))], self.extents, loc)

    def _as_dimension(self, s: ir.For, mask: Mask) -> bool:
        """Emit an independent loop of element stores as parallel dimensions (see the module
        docstring); False where it is not one."""
        start, stop = ir.as_int(s.start), ir.as_int(s.stop)
        if (not self.thread_var or s.kind not in (ir.ForKind.SERIAL, ir.ForKind.UNROLL)
                or start is None or stop is None or ir.as_int(s.step) != 1 or stop <= start):
            return False
        leaves = list(self._leaves(s.body.stmts, ()))
        if not leaves or any(x is None for x in leaves):
            return False
        if s.var not in self.vectorized and not self._independent(s, [t for t, _ in leaves]):
            return False
        per_thread = [bool(mask) or bool(m) or self._stmt_varying(t) for t, m in leaves]
        if not any(per_thread) or any(
                not pt and _target(t).scope is ir.Scope.LOCAL for (t, _), pt in zip(leaves, per_thread)):
            return False
        offset = {s.var: s.var if start == 0 else
                  ir.BinOp(ir.BinOpKind.ADD, s.var, _const(start, s.loc), _I32, s.loc)}

        def shifted(node):          # the loop's index counted from its start
            return transform(node, lambda x: offset.get(x) if isinstance(x, ir.Var) else None)
        self._flush()
        groups: list[tuple[bool, list]] = []
        for (t, m), pt in zip(leaves, per_thread):
            t, m = shifted(t), mask + tuple(shifted(c) for c in m)
            if groups and groups[-1][0] == pt:
                groups[-1][1].append((t, m))
            else:
                groups.append((pt, [(t, m)]))
        for pt, stmts in groups:
            self._emit(self._parallel([s.var], [stop - start], stmts, per_thread=pt))
        return True

    def _leaves(self, stmts, mask):
        """(element statement, mask) pairs of a loop body made only of element stores, atomics
        and branches; a None in the output where it holds anything else."""
        for t in stmts:
            if isinstance(t, ir.If):
                cond = t.cond
                yield from self._leaves(t.then.stmts, _and(mask, cond))
                yield from self._leaves(t.orelse.stmts, _and(mask, _not(cond)))
            elif (isinstance(t, (ir.Store, ir.AtomicAdd)) and not isinstance(t.value, ir.Region)
                  and getattr(t, "prev", None) is None):
                yield t, mask
            else:
                yield None

    @staticmethod
    def _independent(s: ir.For, stmts: list[ir.Stmt]) -> bool:
        """Every store gives each iteration its own element and nothing read is written."""
        reads, writes = footprint(*stmts)
        if reads & writes:
            return False
        for t in stmts:
            if isinstance(t, ir.AtomicAdd):
                continue
            if not any((linear(i) or {}).get(s.var) in (1, -1) for i in t.indices):
                return False
        return True

    def _fill(self, s: ir.Fill, mask: Mask) -> None:
        if not mask and not self.is_varying(s.value):
            self._emit(dataclasses.replace(s, dst=self._whole(s.dst)))
            return
        loc = s.loc
        idx = [ir.Var(self.fresh("i"), _I32, ir.VarKind.LOOP, loc) for _ in s.dst.extents]
        target = tuple(ir.BinOp(ir.BinOpKind.ADD, st, i, _I32, loc) for st, i in zip(s.dst.starts, idx))
        store = ir.Store(s.dst.buffer, target, s.value, loc)
        self._emit(self._parallel(idx, list(s.dst.extents), [(store, mask)], per_thread=True))

    def _block_wide(self, s: ir.Stmt, mask: Mask) -> None:
        what = _what(s)
        if mask:
            raise CompileError(f"{what} under a per-thread condition: all threads of the block run "
                               f"it together, so it cannot depend on one thread's branch or loop",
                               s.loc)
        if isinstance(s, (ir.Role, ir.WarpSpecialize)):
            self._emit(self._roles(s))
            return
        touched = [b for t in walk(s) for b in buffers_read(t) + buffers_written(t)]
        reads_thread = any(self.is_varying(e) for t in walk(s) for e in exprs_of(t))
        if isinstance(s, (ir.Copy, ir.Reduce)) and all(b in self.varying for b in touched) and not reads_thread:
            self._emit(self._whole_locals(s))
            return
        if reads_thread or any(b in self.varying for b in touched):
            raise CompileError(f"{what} reads a thread index or per-thread local: it runs on the "
                               f"block's tiles; index them from the thread in per-thread statements "
                               f"outside T.Parallel instead", s.loc)
        self._emit(s)

    def _whole_locals(self, s: ir.Stmt) -> ir.Stmt:
        if isinstance(s, ir.Copy):
            regions = {f: getattr(s, f) for f in ("src", "dst")}
            return dataclasses.replace(s, **{f: self._whole(r) if r.buffer in self.promoted else r
                                             for f, r in regions.items()})
        if s.src in self.promoted and s.dst in self.promoted:       # Reduce
            return dataclasses.replace(s, src=self.promoted[s.src], dst=self.promoted[s.dst],
                                       dim=s.dim + len(self.extents))
        if s.src not in self.promoted and s.dst not in self.promoted:
            return s
        raise CompileError(f"{_what(s)} between a per-thread local and a uniform one: both must "
                           f"be per-thread", s.loc)

    def _roles(self, s):
        if isinstance(s, ir.WarpSpecialize):
            return dataclasses.replace(s, roles=tuple(self._roles(r) for r in s.roles))
        with self._block() as body:
            self._seq(s.body.stmts, ())
        return dataclasses.replace(s, body=ir.Seq(tuple(body), s.body.loc))


def _target(s) -> ir.Buffer:
    return s.buffer if isinstance(s, ir.Store) else s.dst.buffer


def _what(s: ir.Stmt) -> str:
    names = {ir.Copy: "T.copy", ir.Gemm: "T.gemm", ir.Fill: "T.fill", ir.Reduce: "a reduction",
             ir.CumSum: "T.cumsum", ir.BlockSync: "a block barrier (T.sync_threads)",
             ir.Parallel: "T.Parallel", ir.BarrierArrive: "a barrier arrive",
             ir.BarrierWait: "a barrier wait", ir.AtomicAdd: "a tile T.atomic_add"}
    return names.get(type(s), type(s).__name__)
