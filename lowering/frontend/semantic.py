"""Semantics of the tile language: type and shape checks, then exactly one IR node per operation.

``tilews.language`` functions normalize their arguments and call one function here. Every check a
user can fail raises ``CompileError`` at the current source location.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from .. import ir, schedule
from ..errors import CompileError
from ..roles import describe
from ..traverse import walk
from . import block_wide, parallel_races, reducers, threads
from .context import builder, current_loc
from .values import (BufferRef, ElementRef, RegionRef, Scalar, VarRef, as_dtype,  # noqa: F401
                     bitcast, cast, promote, to_expr)   # as_dtype, bitcast, cast: here for callers (semantic.cast)


def err(msg: str, notes: Sequence[str] = ()) -> CompileError:
    return CompileError(msg, current_loc(), notes)


# ----------------------------------------------------------------------------------------------
# parameters


@dataclass(frozen=True)
class Dynamic:
    """``T.dynamic("m")``: a tensor dimension bound at each call, not part of the compile key."""
    name: str


@dataclass(frozen=True)
class TensorSpec:
    """``T.Tensor(shape, dtype)``: the annotation of a tensor parameter."""
    shape: tuple
    dtype: ir.DType


def tensor_param(name: str, spec: TensorSpec) -> BufferRef:
    b = builder()
    dims = []
    for i, d in enumerate(spec.shape):
        if isinstance(d, str):
            raise err(f"dimension '{d}' of parameter '{name}' is a name; names are bound from the "
                      f"arguments in direct style (@tilews.jit on the kernel function itself)")
        if isinstance(d, Dynamic):
            dims.append(scalar_param(d.name).expr)
        elif isinstance(d, Scalar):
            dims.append(d.expr)
        elif isinstance(d, int) and not isinstance(d, bool) and d > 0:
            dims.append(ir.Const(d, ir.DType.I32, current_loc()))
        elif isinstance(d, int) and not isinstance(d, bool):
            raise err(f"parameter '{name}' has size {d} in dimension {i}; sizes must be positive "
                      f"(a T.dynamic(name) dimension may be 0 at a call)")
        else:
            raise err(f"parameter '{name}' has size {d!r} in dimension {i}; a size must be a "
                      f"positive int or T.dynamic(name)")
    buf = ir.Buffer(b.unique(name), tuple(dims), spec.dtype, ir.Scope.GLOBAL, (), current_loc())
    b.params.append(buf)
    return BufferRef(buf)


def scalar_param(name: str, dtype: ir.DType = ir.DType.I32) -> Scalar:
    """A runtime scalar parameter; one per name."""
    b = builder()
    for p in b.params:
        if isinstance(p, ir.Var) and p.name == name:
            return Scalar(p)
    v = ir.Var(name, dtype, ir.VarKind.PARAM, current_loc())
    b.params.append(v)
    return Scalar(v)


# ----------------------------------------------------------------------------------------------
# frames: `with` and `for` constructs


class Frame:
    """A construct the frontend enters, visits the body of, and exits."""

    def enter(self, names: Sequence[Optional[str]]):
        raise NotImplementedError

    def exit(self, body: list[ir.Stmt]) -> None:
        raise NotImplementedError


MAX_THREADS = 1024   # threads of one CUDA block


def _block(body: list[ir.Stmt]) -> ir.Seq:
    return ir.Seq(tuple(body), current_loc())


class KernelFrame(Frame):
    def __init__(self, grid: Sequence, threads: int, thread_shape: Sequence[int] = ()):
        if not grid or len(grid) > 3:
            raise err(f"T.Kernel takes 1 to 3 grid extents, got {len(grid)}")
        if (not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0
                or threads % 32 or threads > MAX_THREADS):
            raise err(f"T.Kernel(threads=...) must be a multiple of 32 (the warp size) from 32 to "
                      f"{MAX_THREADS} (a GPU block's limit; every target checks it), got {threads!r}")
        for g in grid:
            if isinstance(g, int) and g <= 0:
                raise err(f"grid extents must be positive, got {g}")
        self.grid = tuple(to_expr(g, ir.DType.I32) for g in grid)
        self.threads = threads
        self.thread_shape = tuple(thread_shape) or (threads,)
        self.loc = current_loc()

    def enter(self, names):
        b = builder()
        if b.kernel is not None:
            raise err("T.Kernel inside another T.Kernel: a function's kernels are consecutive "
                      "`with T.Kernel(...)` blocks, each launched after the one before finishes")
        default = ("bx", "by", "bz")
        vars_ = tuple(ir.Var(b.unique(n or default[i]), ir.DType.I32, ir.VarKind.BLOCK, current_loc())
                      for i, n in enumerate((list(names) + [None] * 3)[:len(self.grid)]))
        b.open_kernel(self.grid, self.threads, vars_, self.thread_shape)
        b._stack.append([])
        vals = tuple(Scalar(v) for v in vars_)
        return vals[0] if len(vals) == 1 else vals

    def exit(self, body):
        b = builder()
        b._stack.pop()
        body = threads.lower(body, b.thread_vars, self.thread_shape, b.vectorized_loops, b.unique)
        b.close_kernel(_block(block_wide.assign(body, b.unique)), self.loc)


class WsFrame(Frame):
    def __init__(self, warpgroups: Sequence[int]):
        wgs = tuple(warpgroups)
        if not wgs or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in wgs):
            raise err(f"T.ws takes warp-group ids (non-negative ints), got {warpgroups!r}")
        if len(set(wgs)) != len(wgs):
            raise err(f"{describe(wgs)} names a warp group twice")
        self.warpgroups = tuple(sorted(wgs))
        self.loc = current_loc()

    def enter(self, names):
        b = builder()
        if b.roles:
            raise err(f"{describe(self.warpgroups)} inside {describe(b.roles[-1])}: roles "
                      f"cannot nest")
        if b.parallel_vars:
            raise err("T.ws cannot be used inside T.Parallel")
        b.roles.append(self.warpgroups)
        return None

    def exit(self, body):
        b = builder()
        b.roles.pop()
        b.emit(ir.Role(self.warpgroups, _block(body), loc=self.loc,
                       num_regs=b.register_requests.get(self.warpgroups, 0)))


class LoopFrame(Frame):
    """``range``, ``T.serial``, ``T.unroll`` and ``T.Pipelined`` loops."""

    def __init__(self, kind: ir.ForKind, start, stop=None, step=1, num_stages: int = 0,
                 vectorized: bool = False):
        self.vectorized = vectorized
        if stop is None:
            start, stop = 0, start
        if isinstance(step, int) and step <= 0:
            raise err(f"loop step must be positive, got {step}")
        if kind is ir.ForKind.PIPELINED and (not isinstance(num_stages, int) or num_stages < 0):
            raise err(f"T.Pipelined(num_stages=...) must be a non-negative int, got {num_stages!r}")
        self.kind = kind
        self.start, self.stop, self.step = (to_expr(x, ir.DType.I32) for x in (start, stop, step))
        for name, e in (("start", self.start), ("stop", self.stop), ("step", self.step)):
            if not e.dtype.is_int:
                raise err(f"loop {name} must be an integer, got {e.dtype.value}")
        self.num_stages = num_stages
        self.loc = current_loc()

    def __iter__(self):
        """Iterated as a Python value (a comprehension, ``zip(range(n), ...)``, ``list(...)``),
        a ``range`` is Python's, which needs build-time bounds; a ``for`` statement over it is
        a runtime loop instead (it enters the frame)."""
        bounds = [ir.as_int(e) for e in (self.start, self.stop, self.step)]
        if self.kind is not ir.ForKind.SERIAL or None in bounds:
            raise err("this loop's values are only known when the kernel runs: iterate it with a "
                      "`for` statement (a Python comprehension or call needs build-time range "
                      "bounds)")
        return iter(range(*bounds))

    def enter(self, names):
        if len(names) != 1:
            raise err("this loop binds exactly one index variable")
        b = builder()
        if b.parallel_vars:
            raise err("loops inside T.Parallel are not supported; use nested T.Parallel extents")
        self.var = ir.Var(b.unique(names[0] or "i"), ir.DType.I32, ir.VarKind.LOOP, current_loc())
        if self.vectorized:
            b.vectorized_loops.add(self.var)
        return Scalar(self.var)

    def exit(self, body):
        kind, stages = self.kind, self.num_stages
        if kind is ir.ForKind.PIPELINED and any(isinstance(t, ir.Role) for s in body for t in walk(s)):
            # explicit roles are the loop's pipeline (TileLang's warp-specialized examples): there
            # is nothing left for num_stages to plan, and a pipelined loop is a serial one
            kind, stages = ir.ForKind.SERIAL, 0
        builder().emit(ir.For(self.var, self.start, self.stop, self.step, kind, _block(body),
                              stages, self.loc))


class PersistentFrame(Frame):
    """``for bx, by in T.Persistent([tiles_0, tiles_1], wave_size, index, group_size)``: block
    ``index`` of ``wave_size`` visits tiles index, index + wave_size, ... of the domain, in
    panels of ``group_size`` along dimension 0 (L2-friendly order). With a 1-d domain
    ``[units]`` the loop binds the unit number itself (index, index + wave_size, ... < units),
    and the body maps it to its work (a stream-K program's segments and tiles)."""

    def __init__(self, domain: Sequence, wave_size, index, group_size: int):
        if len(domain) not in (1, 2):
            raise err(f"T.Persistent takes a 1-d or 2-d domain, got {len(domain)} extents")
        if not isinstance(group_size, int) or group_size <= 0:
            raise err(f"T.Persistent(group_size=...) must be a positive int, got {group_size!r}")
        self.domain = tuple(Scalar(to_expr(d, ir.DType.I32)) if isinstance(d, Scalar) else d
                            for d in domain)
        self.wave_size, self.index, self.group_size = wave_size, index, group_size
        self.loc = current_loc()

    def enter(self, names):
        if len(names) != len(self.domain):
            raise err(f"T.Persistent over a {len(self.domain)}-d domain binds {len(self.domain)} "
                      f"index(es), got {len(names)}")
        b = builder()
        # a 0-based count of this block's units: unit = index + i * wave_size
        self.var = ir.Var(b.unique("tile_iter"), ir.DType.I32, ir.VarKind.LOOP, current_loc())
        t = self.index + Scalar(self.var) * self.wave_size
        if len(self.domain) == 1:
            return t
        return grouped_tile(t, self.domain, self.group_size)

    def exit(self, body):
        total = self.domain[0] if len(self.domain) == 1 else self.domain[0] * self.domain[1]
        count = schedule.tiles_of_block(to_expr(total, ir.DType.I32),
                                        to_expr(self.index, ir.DType.I32),
                                        to_expr(self.wave_size, ir.DType.I32), self.loc)
        builder().emit(ir.For(self.var, to_expr(0, ir.DType.I32), count, to_expr(1, ir.DType.I32),
                              ir.ForKind.PERSISTENT, _block(body), 0, self.loc))


def grouped_tile(tile, domain: Sequence, group_size: int) -> tuple:
    """Tile number ``tile`` of a [tiles_0, tiles_1] domain visited in panels of ``group_size``
    along dimension 0 (``T.Persistent``'s order) -> its (index 0, index 1)."""
    if len(domain) != 2:
        raise err(f"a tile domain has 2 extents, got {len(domain)}")
    if not isinstance(group_size, int) or group_size <= 0:
        raise err(f"group_size must be a positive int, got {group_size!r}")
    tiles_0, tiles_1 = (to_expr(d, ir.DType.I32) for d in domain)
    return tuple(Scalar(e) for e in schedule.grouped_tile(to_expr(tile, ir.DType.I32), tiles_0,
                                                           tiles_1, group_size, current_loc()))


class ParallelFrame(Frame):
    def __init__(self, extents: Sequence[int]):
        if not extents:
            raise err("T.Parallel needs at least one extent")
        for e in extents:
            if not isinstance(e, int) or isinstance(e, bool) or e <= 0:
                raise err(f"T.Parallel extents must be positive ints known at build time, got {e!r}")
        self.extents = tuple(extents)
        self.loc = current_loc()

    def enter(self, names):
        if len(names) != len(self.extents):
            raise err(f"T.Parallel with {len(self.extents)} extents binds {len(self.extents)} "
                      f"variables, got {len(names)}")
        b = builder()
        if b.parallel_vars:
            raise err("T.Parallel cannot be nested; give all extents to one T.Parallel")
        self.vars = tuple(ir.Var(b.unique(n or "i"), ir.DType.I32, ir.VarKind.PARALLEL, current_loc())
                          for n in names)
        b.parallel_vars.extend(self.vars)
        vals = tuple(Scalar(v) for v in self.vars)
        return vals[0] if len(vals) == 1 else vals

    def exit(self, body):
        b = builder()
        del b.parallel_vars[-len(self.vars):]
        for s in body:
            if not isinstance(s, (ir.Store, ir.If, ir.AtomicAdd)):
                raise CompileError(f"only element stores, `if` and T.atomic_add may appear inside "
                                   f"T.Parallel, not {type(s).__name__.lower()}", s.loc)
        allocs, stmts = reducers.split(ir.Parallel(self.vars, self.extents, _block(body), self.loc),
                                       b.reducers, b.unique)
        for a in allocs:
            _place(a, hoist=True)
        for s in stmts:
            if isinstance(s, ir.Parallel):
                parallel_races.check(s)
            b.emit(s)


def emit_if(cond: Scalar, then: list[ir.Stmt], orelse: list[ir.Stmt], loc: ir.Loc) -> None:
    if cond.dtype is not ir.DType.BOOL:
        c = ir.Cmp(ir.CmpKind.NE, cond.expr, to_expr(0, cond.dtype), loc)
    else:
        c = cond.expr
    builder().emit(ir.If(c, ir.Seq(tuple(then), loc), ir.Seq(tuple(orelse), loc), loc))


# ----------------------------------------------------------------------------------------------
# memory


def alloc(shape, dtype, scope: ir.Scope, name: Optional[str], hoist: bool = False) -> BufferRef:
    """Allocations are kernel-scoped, as in TileLang: one made inside a loop, branch or role is
    placed with the kernel body's allocations, so every later statement of any role sees it.
    ``hoist`` places it there from the kernel body too."""
    b = builder()
    if b.parallel_vars:
        raise err("buffers cannot be allocated inside T.Parallel")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            raise err(f"{scope.value} buffer shape must be positive ints known at build time, "
                      f"got {shape!r}")
    dt = as_dtype(dtype)
    buf = ir.Buffer(b.unique(name or f"{scope.value}_buf"), tuple(ir.Const(d, ir.DType.I32, current_loc())
                                                             for d in shape),
                    dt, scope, (), current_loc())
    _place(ir.Alloc(buf, current_loc()), hoist)
    return BufferRef(buf)


def _place(a: ir.Alloc, hoist: bool = False) -> None:
    b = builder()
    if hoist or b.nested():
        b.hoist_alloc(a)
    else:
        b.emit(a)


def alloc_barriers(counts: Sequence[int], name: Optional[str]) -> BufferRef:
    b = builder()
    for c in counts:
        if not isinstance(c, int) or isinstance(c, bool) or c <= 0:
            raise err(f"barrier arrive counts must be positive ints (threads), got {c!r}")
    buf = ir.Buffer(b.unique(name or "mbar"), (ir.Const(len(counts), ir.DType.I32, current_loc()),),
                    ir.DType.I64, ir.Scope.BARRIER, tuple(counts), current_loc())
    _place(ir.Alloc(buf, current_loc()))
    return BufferRef(buf)


def mbarrier_list(counts: Sequence[int]) -> None:
    b = builder()
    if b.mbarrier_list is not None:
        raise err("T.create_list_of_mbarrier may be called once per kernel")
    b.mbarrier_list = alloc_barriers(counts, "mbarrier").buffer


def get_mbarrier(i) -> ElementRef:
    b = builder()
    if b.mbarrier_list is None:
        raise err("T.get_mbarrier needs T.create_list_of_mbarrier earlier in the kernel")
    return ElementRef(b.mbarrier_list, (to_expr(i, ir.DType.I32),))


def barrier_ref(bar, what: str = "barrier") -> ir.BarrierRef:
    if isinstance(bar, int) and not isinstance(bar, bool):
        bar = get_mbarrier(bar)
    if isinstance(bar, ElementRef):
        buf, index = bar.buffer, bar.indices[0]
    elif isinstance(bar, BufferRef):
        buf, index = bar.buffer, to_expr(0)
        if buf.scope is ir.Scope.BARRIER and len(buf.arrive_counts) != 1:
            raise err(f"'{buf.name}' holds {len(buf.arrive_counts)} barriers; index it")
    else:
        raise err(f"{what} must be a barrier from T.alloc_barrier, got {bar!r}")
    if buf.scope is not ir.Scope.BARRIER:
        raise err(f"{what} must be a barrier from T.alloc_barrier, got {buf.scope.value} "
                  f"buffer '{buf.name}'")
    return ir.BarrierRef(buf, index, current_loc())


# ----------------------------------------------------------------------------------------------
# regions


def _whole(buf: ir.Buffer) -> ir.Region:
    if any(ir.as_int(d) is None for d in buf.shape):
        raise err(f"'{buf.name}' has runtime dimensions; give a region start (e.g. {buf.name}[i, j])")
    return ir.Region(buf, tuple(ir.Const(0, ir.DType.I32, current_loc()) for _ in buf.shape),
                     buf.static_shape, current_loc())


def as_region(x, what: str, extent_from: Optional[ir.Region] = None) -> ir.Region:
    """A Region from a buffer, a slice, or a start index (extents taken from ``extent_from``)."""
    if isinstance(x, BufferRef):
        return _whole(x.buffer)
    if isinstance(x, RegionRef):
        return x.region
    if isinstance(x, ElementRef):
        if extent_from is None:
            raise err(f"{what}: a start index like {x.buffer.name}[i, j] needs the other operand to "
                      f"be a whole buffer or a slice that gives the extent")
        tile = extent_from.tile_shape
        rank = len(x.indices)
        if len(tile) > rank:
            raise err(f"{what}: a {len(tile)}-d tile does not fit in {rank}-d '{x.buffer.name}'")
        extents = (1,) * (rank - len(tile)) + tile
        return ir.Region(x.buffer, x.indices, extents, current_loc())
    raise err(f"{what} must be a buffer, a region (A[i:i+m, :]) or a start index (A[i, j]), got {x!r}")


def _check_in_bounds(r: ir.Region, what: str) -> None:
    """Regions of on-chip buffers must lie inside them (global regions are masked instead)."""
    if r.buffer.scope is ir.Scope.GLOBAL:
        return
    for d, (s, e, dim) in enumerate(zip(r.starts, r.extents, r.buffer.static_shape)):
        si = ir.as_int(s)
        if si is not None and (si < 0 or si + e > dim):
            raise err(f"{what}: region [{si}:{si + e}] of dimension {d} is outside "
                      f"'{r.buffer.name}' (extent {dim})")


def _pair(src, dst, what: str) -> tuple[ir.Region, ir.Region]:
    if isinstance(src, ElementRef) and isinstance(dst, ElementRef):
        raise err(f"{what}: both operands are start indices; one must give the extent")
    if isinstance(src, ElementRef):
        d = as_region(dst, f"{what} destination")
        s = as_region(src, f"{what} source", d)
    else:
        s = as_region(src, f"{what} source")
        d = as_region(dst, f"{what} destination", s)
    if s.tile_shape != d.tile_shape:
        raise err(f"{what}: source tile {list(s.tile_shape)} and destination tile "
                  f"{list(d.tile_shape)} differ")
    _check_in_bounds(s, what)
    _check_in_bounds(d, what)
    return s, d


# ----------------------------------------------------------------------------------------------
# tile operations


def _tile_op(what: str) -> None:
    if builder().parallel_vars:
        raise err(f"{what} is a tile operation and cannot be used inside T.Parallel")


def copy(src, dst, barrier=None) -> None:
    _tile_op("T.copy")
    s, d = _pair(src, dst, "T.copy")
    _emit_copy(s, d, barrier, "T.copy")


def tma_copy(src, dst, barrier) -> None:
    """TileLang's split-phase copy: global -> shared completes on ``barrier`` (required), shared ->
    global is a plain store."""
    _tile_op("T.tma_copy")
    s, d = _pair(src, dst, "T.tma_copy")
    route = (s.buffer.scope, d.buffer.scope)
    if route == (ir.Scope.GLOBAL, ir.Scope.SHARED) and barrier is None:
        raise err("T.tma_copy from global to shared memory needs barrier=...: the barrier whose "
                  "current phase the load completes on")
    if route == (ir.Scope.SHARED, ir.Scope.GLOBAL) and barrier is not None:
        raise err("T.tma_copy from shared to global memory takes no barrier (a store completes "
                  "on no barrier)")
    if route not in ((ir.Scope.GLOBAL, ir.Scope.SHARED), (ir.Scope.SHARED, ir.Scope.GLOBAL)):
        raise err(f"T.tma_copy copies global -> shared or shared -> global memory, not "
                  f"{s.buffer.scope.value} -> {d.buffer.scope.value}; use T.copy")
    _emit_copy(s, d, barrier, "T.tma_copy")


def _emit_copy(s: ir.Region, d: ir.Region, barrier, what: str) -> None:
    if d.buffer.scope is ir.Scope.BARRIER or s.buffer.scope is ir.Scope.BARRIER:
        raise err(f"{what} cannot copy barriers")
    bar = None
    if barrier is not None:
        bar = barrier_ref(barrier, f"{what}(barrier=...)")
        if not (s.buffer.scope is ir.Scope.GLOBAL and d.buffer.scope is ir.Scope.SHARED):
            raise err(f"{what}(barrier=...) completes asynchronously and is only for global -> "
                      f"shared copies")
    builder().emit(ir.Copy(s, d, bar, ir.CopyMechanism.UNDECIDED, current_loc()))


def gemm(a, b, c, transpose_a: bool, transpose_b: bool, clear_accum: bool,
         precision: ir.GemmPrecision = ir.GemmPrecision.TF32) -> None:
    _tile_op("T.gemm")
    ra, rb, rc = (as_region(x, f"T.gemm operand {n}") for x, n in ((a, "A"), (b, "B"), (c, "C")))
    for r, n in ((ra, "A"), (rb, "B"), (rc, "C")):
        _check_in_bounds(r, "T.gemm")
        if len(r.tile_shape) != 2:
            raise err(f"T.gemm operand {n} ('{r.buffer.name}') must be a 2-d tile, got "
                      f"{list(r.tile_shape)}")
    for r, n in ((ra, "A"), (rb, "B")):
        if r.buffer.scope not in (ir.Scope.SHARED, ir.Scope.FRAGMENT, ir.Scope.LOCAL):
            raise err(f"T.gemm operand {n} ('{r.buffer.name}') must be in shared memory or a "
                      f"fragment, not {r.buffer.scope.value}")
    if rc.buffer.scope not in (ir.Scope.FRAGMENT, ir.Scope.LOCAL):
        raise err(f"T.gemm accumulator C ('{rc.buffer.name}') must be a fragment "
                  f"(T.alloc_fragment), not {rc.buffer.scope.value}")
    m, k = ra.tile_shape[::-1] if transpose_a else ra.tile_shape
    k2, n = rb.tile_shape[::-1] if transpose_b else rb.tile_shape
    if k != k2:
        raise err(f"T.gemm: A is {m}x{k} but B is {k2}x{n} (K differs)",
                  ["transpose_A / transpose_B select the layout of each operand"])
    if rc.tile_shape != (m, n):
        raise err(f"T.gemm: C is {list(rc.tile_shape)} but A @ B is [{m}, {n}]")
    da, db, dc = ra.buffer.dtype, rb.buffer.dtype, rc.buffer.dtype
    if da != db and not (da.is_fp8 and db.is_fp8):
        raise err(f"T.gemm: A is {da.value} but B is {db.value}")
    if not (dc.is_float or dc is ir.DType.I32) or dc.is_fp8:
        raise err(f"T.gemm: accumulator must be f32/f16/f64 or i32, got {dc.value}")
    if da.is_int != (dc is ir.DType.I32):
        raise err(f"T.gemm: {da.value} operands need a {'i32' if da.is_int else 'float'} accumulator")
    builder().emit(ir.Gemm(ra, rb, rc, bool(transpose_a), bool(transpose_b), bool(clear_accum),
                           ir.GemmInstr.UNDECIDED, precision, current_loc()))


def fill(dst, value) -> None:
    """``T.fill`` / ``T.clear``: of an on-chip buffer or region, each element; of a
    ``T.alloc_var`` variable, its value."""
    _tile_op("T.fill")
    if isinstance(dst, VarRef):
        store(dst, value)
        return
    r = as_region(dst, "T.fill destination")
    _check_in_bounds(r, "T.fill")
    if r.buffer.scope in (ir.Scope.GLOBAL, ir.Scope.BARRIER):
        raise err(f"T.fill writes on-chip buffers, not {r.buffer.scope.value} '{r.buffer.name}'")
    builder().emit(ir.Fill(r, to_expr(value, r.buffer.dtype), current_loc()))


def _along_dim(what: str, src, dst, dim) -> tuple[ir.Buffer, ir.Buffer, int]:
    """The on-chip buffers of a tile operation along one dim of ``src`` (reductions, scans),
    and that dim made non-negative."""
    _tile_op(what)
    if not isinstance(src, BufferRef) or not isinstance(dst, BufferRef):
        raise err(f"{what} takes whole buffers (src, dst)")
    s, d = src.buffer, dst.buffer
    for x in (s, d):
        if x.scope not in (ir.Scope.FRAGMENT, ir.Scope.SHARED, ir.Scope.LOCAL):
            raise err(f"{what}: '{x.name}' must be an on-chip buffer")
    rank = len(s.shape)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
        raise err(f"{what}: dim={dim!r} is out of range for {rank}-d '{s.name}'")
    return s, d, dim % rank


def reduce(kind: ir.ReduceKind, src, dst, dim: int, clear: bool) -> None:
    s, d, dim = _along_dim(f"T.reduce_{kind.value}", src, dst, dim)
    shape = s.static_shape
    expect = shape[:dim] + shape[dim + 1:] or (1,)
    if d.static_shape != expect:
        raise err(f"T.reduce_{kind.value}: reducing {list(shape)} over dim {dim} gives "
                  f"{list(expect)}, but '{d.name}' is {list(d.static_shape)}")
    builder().emit(ir.Reduce(kind, s, d, dim, bool(clear), current_loc()))


def cumsum(src, dst, dim: int, reverse: bool) -> None:
    s, d, dim = _along_dim("T.cumsum", src, src if dst is None else dst, dim)
    if d.static_shape != s.static_shape or d.dtype != s.dtype:
        raise err(f"T.cumsum: dst '{d.name}' ({d.dtype}{list(d.static_shape)}) must have the "
                  f"shape and dtype of src '{s.name}' ({s.dtype}{list(s.static_shape)})")
    if not (s.dtype.is_float or s.dtype.is_int):
        raise err(f"T.cumsum sums numbers, not {s.dtype} ('{s.name}')")
    builder().emit(ir.CumSum(s, d, dim, bool(reverse), current_loc()))


def store(target, value) -> None:
    """``buf[i, j] = value`` (per element inside T.Parallel)."""
    if isinstance(target, RegionRef):
        raise err("assigning to a slice is not supported; use T.copy or T.fill")
    if not isinstance(target, ElementRef):
        raise err("only buffer elements can be assigned")
    buf = target.buffer
    if buf.scope is ir.Scope.BARRIER:
        raise err(f"'{buf.name}' is a barrier and cannot be assigned")
    builder().emit(ir.Store(buf, target.indices, to_expr(value, buf.dtype), current_loc()))


def atomic_add(dst, value, order: str = "relaxed", return_prev: bool = False) -> Optional[Scalar]:
    """Tile form: value is a buffer or region; element form: value is a scalar. ``return_prev``
    (element form outside T.Parallel): the previous value, through a local of dst's type."""
    if isinstance(value, (BufferRef, RegionRef)):
        _tile_op("T.atomic_add of a tile")
        if return_prev:
            raise err("T.atomic_add(return_prev=True) needs an element destination and a scalar "
                      "value; a tile add returns nothing")
        v, r = _pair(value, dst, "T.atomic_add")
        payload: object = v
    else:
        if not isinstance(dst, ElementRef):
            raise err("T.atomic_add with a scalar value needs an element destination (C[i, j])")
        r = ir.Region(dst.buffer, dst.indices, (1,) * len(dst.indices), current_loc())
        payload = to_expr(value, dst.buffer.dtype)
    if r.buffer.scope is not ir.Scope.GLOBAL and not (
            r.buffer.scope is ir.Scope.SHARED and not isinstance(payload, ir.Region)):
        raise err(f"T.atomic_add targets global memory (or, element by element, shared memory), "
                  f"not {r.buffer.scope.value} '{r.buffer.name}'")
    if order not in ir.MEMORY_ORDERS:
        raise err(f"T.atomic_add: memory order {order!r} is not one of {', '.join(ir.MEMORY_ORDERS)}")
    prev = None
    if return_prev:
        if builder().parallel_vars:
            raise err("T.atomic_add(return_prev=True) inside T.Parallel is not supported: outside "
                      "it the add is one per block and its previous value one scalar")
        prev = alloc((1,), r.buffer.dtype, ir.Scope.LOCAL, "prev").buffer
    builder().emit(ir.AtomicAdd(r, payload, current_loc(), prev, order))
    return None if prev is None else Scalar(ir.Load(prev, (ir.Const(0, ir.DType.I32, current_loc()),),
                                                   current_loc()))


def thread_index(dim: int, extent=None) -> Scalar:
    """A thread's index along ``dim`` (0, 1, 2: x, y, z) of the kernel's ``threads``; ``extent``,
    where given, must be that dimension's thread count."""
    b = builder()
    shape = b.thread_shape
    if b.kernel is None:
        raise err("thread indices exist inside `with T.Kernel(...)` only")
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < 3:
        raise err(f"thread dimension must be 0, 1 or 2 (x, y, z), got {dim!r}")
    count = shape[dim] if dim < len(shape) else 1
    if extent is not None and extent != count:
        raise err(f"thread dimension {dim} has {count} threads (T.Kernel(threads={shape})), "
                  f"not {extent}")
    if b.roles:
        raise err("thread indices inside T.ws are not supported: a role's threads are a part of "
                  "the block's")
    var = b.thread_vars.get(dim)
    if var is None:
        var = ir.Var(b.unique(b.name_hint or ("tx", "ty", "tz")[dim]), ir.DType.I32,
                     ir.VarKind.THREAD, current_loc())
        b.thread_vars[dim] = var
    return Scalar(var)


def sync_threads() -> None:
    """``T.sync_threads()``: a block barrier; every thread must reach it."""
    _tile_op("T.sync_threads")
    builder().emit(ir.BlockSync(False, current_loc()))


def barrier_arrive(bar) -> None:
    _tile_op("T.barrier_arrive")
    builder().emit(ir.BarrierArrive(barrier_ref(bar), current_loc()))


def barrier_wait(bar, parity) -> None:
    _tile_op("T.barrier_wait")
    p = to_expr(parity, ir.DType.I32)
    if not p.dtype.is_int and p.dtype is not ir.DType.BOOL:
        raise err(f"barrier parity must be an integer (0 or 1), got {p.dtype.value}")
    if ir.as_int(p) is not None and ir.as_int(p) not in (0, 1):
        raise err(f"barrier parity must be 0 or 1, got {ir.as_int(p)}")
    builder().emit(ir.BarrierWait(barrier_ref(bar), p, current_loc()))


def use_swizzle(panel: int) -> None:
    if not isinstance(panel, int) or panel <= 0:
        raise err(f"T.use_swizzle(panel_size) takes a positive int, got {panel!r}")
    builder().swizzle_panel = panel


# ----------------------------------------------------------------------------------------------
# math


_PY_MATH = {ir.MathFn.EXP: math.exp, ir.MathFn.EXP2: lambda x: 2.0 ** x, ir.MathFn.LOG: math.log,
            ir.MathFn.LOG2: math.log2, ir.MathFn.ABS: abs, ir.MathFn.SQRT: math.sqrt,
            ir.MathFn.RSQRT: lambda x: 1.0 / math.sqrt(x), ir.MathFn.MAX: max, ir.MathFn.MIN: min,
            ir.MathFn.CEIL: lambda x: float(math.ceil(x))}


def math_call(fn: ir.MathFn, *args):
    if not any(isinstance(a, Scalar) for a in args):
        return _PY_MATH[fn](*args)
    dts = [a.dtype for a in args if isinstance(a, Scalar)]
    dt = dts[0]
    for d in dts[1:]:
        dt = promote(dt, d)
    exprs = tuple(to_expr(a, dt) for a in args)
    if fn not in (ir.MathFn.MAX, ir.MathFn.MIN, ir.MathFn.ABS):
        if not dt.is_float:
            exprs = tuple(ir.Cast(e, ir.DType.F32, current_loc()) for e in exprs)
            dt = ir.DType.F32
    else:
        exprs = tuple(e if e.dtype == dt else ir.Cast(e, dt, current_loc()) for e in exprs)
    return Scalar(ir.Call(fn, exprs, dt, current_loc()))


def select(cond, a, b):
    if not isinstance(cond, Scalar):
        return a if cond else b
    da = a.dtype if isinstance(a, Scalar) else None
    db = b.dtype if isinstance(b, Scalar) else None
    dt = promote(da, db) if da and db else (da or db)
    ea, eb = to_expr(a, dt), to_expr(b, dt)
    dt = dt or promote(ea.dtype, eb.dtype)
    ea = ea if ea.dtype == dt else ir.Cast(ea, dt, current_loc())
    eb = eb if eb.dtype == dt else ir.Cast(eb, dt, current_loc())
    return Scalar(ir.Select(cond.expr, ea, eb, dt, current_loc()))


def infinity(dtype) -> Scalar:
    dt = as_dtype(dtype)
    if not dt.is_float:
        raise err(f"T.infinity needs a float dtype, got {dt.value}")
    return Scalar(ir.Const(math.inf, dt, current_loc()))
