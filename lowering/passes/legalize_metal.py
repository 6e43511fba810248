"""legalize_metal: where each fragment lives on a target of SIMD threads with simdgroup matrices,
how the statements over fragments run there, and what Metal cannot run.

Requires:  legalize has run (one stream: no roles or barriers; copy mechanisms decided). In the
           pipelines of backends with simdgroup matrices (metal).
Ensures:   a ``FragmentStoragePlan`` (``lowering.plans``) giving every fragment and local buffer one
           storage, decided from every access the program makes to it:

           * ``matrix`` for a gemm accumulator (float32 or float16) that is otherwise only filled
             whole, copied out whole to global or shared memory, and read or written by
             ``T.Parallel`` loops at their own indices (such a loop then runs per simdgroup tile;
             the other fragments it touches at its own indices join the matrices, with the same
             tiling, where their uses allow, else live in shared memory);
           * ``registers`` for a buffer every access of which the owning thread makes: whole fills,
             whole copies (with, on the other side, global or shared memory or a buffer of the same
             shape held the same way), ``T.Parallel`` loops over exactly its shape that access it
             at their own indices in order, whole-tile atomic adds from it;
           * ``private`` for a per-thread local (shape: the block's thread dims, then its own
             shape) every element access of which a ``T.Parallel(per_thread)`` makes at its own
             thread's indices, otherwise only filled whole or copied whole to or from another
             such buffer: each thread keeps its own part (its thread's elements) in registers;
           * ``replicated`` for a small buffer (<= 256 bytes) written only outside ``T.Parallel``
             (element stores and whole fills): every thread keeps the same copy;
           * ``shared`` for everything else (gemm operands, reduction and scan sources and results,
             buffers read across threads), in the block's shared memory.

           Every gemm's accumulator gets a ``MatrixTiling`` over the block's simdgroups (the most
           simdgroups that divide its rows and columns into multiples of 8, the most square tiles
           per simdgroup among those). Shared buffers that feed a gemm with FP8 elements become
           float16 (every FP8 value is exact there; the copy into them decodes). The plan also
           records the block's simdgroups and their width (32 threads), the block's thread dims
           (slowest first, as the per-thread ``T.Parallel`` loops iterate them: the shortest
           prefix of their extents that counts every thread), and how each statement
           over fragments runs, by keys the later passes (``double_buffer``, ``insert_syncs``) keep:
           whether a copy out of a matrix accumulator is staged through scratch (it masks,
           converts, or writes rows that are not contiguous) or stored straight; how many
           simdgroups reduce each output of a reduction together (several only for fewer float
           outputs than simdgroups); which matrix buffers a ``T.Parallel`` touches (it then runs
           per simdgroup tile) and the scratch slot of each. Staging areas (``scratch``: per
           element type, 64-element slots per simdgroup) for those staged copies, reductions and
           loops. The block's shared bytes (shared buffers, spilled fragments, the staging areas)
           are checked against ``config.caps.smem_bytes``. The emitter spells these decisions and
           recomputes none of them.
Errors:    ``CompileError`` at the user's line for what Metal cannot run (a ``PointerView``,
           ``T.make_tensor``: Metal buffers have no addresses to pass in a table; the frontend already holds
           ``threads`` to multiples of 32 up to 1024, Metal's limits too, grids to 3 dims, copies to
           tiles of one shape and atomic adds to global or shared memory): a gemm whose tile dims are not
           multiples of 8, whose operands are not float16/bfloat16/float32 (FP8 decoded), or whose
           accumulator is not float32/float16; a tile-form operand that is not the last two dims of
           its buffer; more shared memory than the target has (naming the largest buffers); then,
           at the first such node in program order, a value of a type Metal lacks (float64: a
           parameter, a buffer, a constant, a cast) and an atomic add that returns the previous
           value, has a memory order other than relaxed, or adds elements other than float32,
           int32 or uint32 (in shared memory, Metal has no float atomics: a float32 add is a
           compare-and-swap loop on the element's bits, which the emitter spells).
Preserves: program meaning and every node's loc (FP8 -> float16 is exact).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .. import ir
from ..errors import CompileError, InternalError
from ..plans import FragmentStoragePlan, MatrixTiling, SharedMemoryPlan
from ..config import BackendConfig
from . import plan_buffers
from ..traverse import element_accesses, exprs_of, subexprs, substmts, transform, walk

SIMD = 32
MATRIX = 8
REPLICATED_MAX_BYTES = 256
GEMM_OPERANDS = (ir.DType.F16, ir.DType.BF16, ir.DType.F32)
ACCUMULATORS = (ir.DType.F32, ir.DType.F16)
ATOMICS = (ir.DType.F32, ir.DType.I32, ir.DType.U32)   # what Metal adds atomically (float32 in
                                                       # threadgroup memory by compare-and-swap)
ON_CHIP = (ir.Scope.FRAGMENT, ir.Scope.LOCAL)


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    decoded = _decode_fp8_operands(kernel)
    if decoded is not kernel:     # float16 tiles take twice the FP8 bytes: place them again
        kernel = plan_buffers.run(decoded, config)
    simdgroups = kernel.threads // SIMD
    tilings = {}
    for s in walk(kernel.body):
        if isinstance(s, ir.PointerView):
            raise CompileError("T.make_tensor is not supported on Metal: Metal buffers have no "
                               "device addresses a pointer table could hold", s.loc,
                               ["pass the tensors as parameters, or run on target 'triton' or "
                                "'interpret'"])
        if isinstance(s, ir.Gemm):
            _check_gemm(s)
            tilings.setdefault(s.c.buffer.name, _tiling(s, simdgroups))
    thread_shape = _thread_shape(kernel)
    uses = _Uses(thread_shape)
    uses.stmt(kernel.body, None)
    storage = _decide(uses, tilings)
    statements = _Statements(kernel, storage, simdgroups)
    scratch = statements.scratch()
    shared = kernel.plan(SharedMemoryPlan).total_bytes
    spilled = [(b.name, b.nbytes) for b in uses.buffers.values() if storage[b.name] == "shared"]
    total = shared + sum(n for _, n in spilled) + sum(MATRIX * MATRIX * simdgroups * n * t.itemsize
                                                      for t, n in scratch)
    if total > config.caps.smem_bytes:
        biggest = sorted(list(kernel.plan(SharedMemoryPlan).ranges) + [(n, 0, b) for n, b in spilled],
                         key=lambda r: -r[2])[:3]
        raise CompileError(
            f"kernel '{kernel.name}' needs {total} bytes of threadgroup memory on target "
            f"'{config.name}', more than its {config.caps.smem_bytes}", kernel.loc,
            [f"largest: {', '.join(f'{n} ({b} bytes)' for n, _, b in biggest)}",
             "fragments that are reduced, read across threads or fed to T.gemm live in threadgroup "
             "memory on Metal; shrink block_M/block_N/block_K"])
    _check_spellable(kernel)     # after the budget, as when the emitter refused these
    plan = FragmentStoragePlan(tuple(sorted(storage.items())), tuple(sorted(tilings.items())),
                               total, scratch, simdgroups, SIMD, statements.table("copies"),
                               statements.table("reductions"), statements.table("parallels"),
                               thread_shape)
    return kernel.with_plan(plan)


def _thread_shape(kernel: ir.Kernel) -> tuple[int, ...]:
    """The block's thread dims (z, y, x), as the per-thread T.Parallel loops iterate them: the
    shortest prefix of their extents that counts the block's threads (a trailing thread dim of
    extent 1 then reads as a vector dim of one iteration: the same work). () without such loops."""
    shapes = set()
    for s in walk(kernel.body):
        if isinstance(s, ir.Parallel) and s.per_thread:
            n = next((k for k in range(1, len(s.extents) + 1)
                      if math.prod(s.extents[:k]) == kernel.threads), None)
            if n is None:
                raise InternalError(f"legalize_metal: the per-thread T.Parallel over "
                                    f"{list(s.extents)} does not start with the block's "
                                    f"{kernel.threads} threads", s.loc)
            shapes.add(tuple(s.extents[:n]))
    if len(shapes) > 1:
        raise InternalError(f"legalize_metal: per-thread T.Parallel loops over different thread "
                            f"dims {sorted(shapes)}", kernel.loc)
    return shapes.pop() if shapes else ()


# ----------------------------------------------------------------------------------------------
# gemms


def _check_gemm(s: ir.Gemm) -> None:
    for name, r in (("A", s.a), ("B", s.b), ("C", s.c)):
        dims = [d for d, e in enumerate(r.extents) if e != 1]
        n = len(r.extents)
        if dims != [n - 2, n - 1]:
            raise CompileError(f"T.gemm operand {name} ('{r.buffer.name}'): on Metal a gemm operand "
                               f"is a 2-d tile over the last two dims of its buffer; got extents "
                               f"{list(r.extents)}", s.loc)
        if r.extents[-1] % MATRIX or r.extents[-2] % MATRIX:
            raise CompileError(f"T.gemm operand {name} ('{r.buffer.name}') is a "
                               f"{r.extents[-2]}x{r.extents[-1]} tile; Metal's simdgroup matrices "
                               f"need both dims to be multiples of {MATRIX}", s.loc)
    for name, r in (("A", s.a), ("B", s.b)):
        if r.buffer.dtype not in GEMM_OPERANDS:
            raise CompileError(f"T.gemm operand {name} ('{r.buffer.name}') is {r.buffer.dtype}; Metal "
                               f"multiplies float16, bfloat16, float32 (and FP8 decoded to float16)",
                               s.loc)
    if s.c.buffer.dtype not in ACCUMULATORS:
        raise CompileError(f"T.gemm accumulator '{s.c.buffer.name}' is {s.c.buffer.dtype}; Metal "
                           f"accumulates in float32 or float16", s.loc)


# ----------------------------------------------------------------------------------------------
# values and atomics


def _check_spellable(kernel: ir.Kernel) -> None:
    """Refuses, at the first such node in program order, a value of a type Metal does not have
    (float64) and an atomic add Metal does not spell (returning the previous value, ordered, or of
    an element type other than float32, int32, uint32; the frontend keeps atomics to global
    memory)."""
    for p in kernel.params:
        _check_type(p.dtype, p.loc)
    for _, e in kernel.block_defs:
        _check_expr_types(e, kernel.loc)
    for s in walk(kernel.body):
        if isinstance(s, ir.Alloc) and s.buffer.scope is not ir.Scope.BARRIER:
            _check_type(s.buffer.dtype, s.loc)
        if isinstance(s, ir.AtomicAdd):
            _check_atomic(s)
        for e in exprs_of(s):
            _check_expr_types(e, s.loc)


def _check_type(dtype: ir.DType, loc: ir.Loc) -> None:
    if not dtype.record.msl:
        raise CompileError(f"{dtype} has no Metal type (Metal has no 64-bit floats); use float32", loc)


def _check_expr_types(e: ir.Expr, loc: ir.Loc) -> None:
    for x in subexprs(e):
        _check_type(x.dtype, x.loc if x.loc.line > 0 else loc)


def _check_atomic(s: ir.AtomicAdd) -> None:
    b = s.dst.buffer
    if s.prev is not None or s.order != "relaxed":
        what = "return_prev=True" if s.prev is not None else f"memory_order={s.order!r}"
        raise CompileError(f"T.atomic_add into '{b.name}' with {what}: the Metal backend spells "
                           f"relaxed adds that return nothing", s.loc)
    if b.dtype not in ATOMICS:
        where = "threadgroup (shared)" if b.scope is ir.Scope.SHARED else "global"
        raise CompileError(f"T.atomic_add into '{b.name}' ({b.scope.value}, {b.dtype}): Metal adds "
                           f"atomically to float32, int32 and uint32 in {where} memory", s.loc)


def _tiling(s: ir.Gemm, simdgroups: int) -> MatrixTiling:
    rows, cols = s.c.extents[-2] // MATRIX, s.c.extents[-1] // MATRIX
    best = None
    for wm in range(1, simdgroups + 1):
        for wn in range(1, simdgroups // wm + 1):
            if rows % wm or cols % wn:
                continue
            tm, tn = rows // wm, cols // wn
            key = (wm * wn, -abs(tm - tn), wm)
            if best is None or key > best[0]:
                best = (key, MatrixTiling(wm, wn, tm, tn))
    return best[1]


def _decode_fp8_operands(kernel: ir.Kernel) -> ir.Kernel:
    """Shared buffers feeding a gemm with FP8 elements hold float16 instead."""
    fp8 = {r.buffer for s in walk(kernel.body) if isinstance(s, ir.Gemm) for r in (s.a, s.b)
           if r.buffer.scope is ir.Scope.SHARED and r.buffer.dtype.is_fp8}
    if not fp8:
        return kernel
    wide = {b: dataclasses.replace(b, dtype=ir.DType.F16) for b in fp8}
    body = transform(kernel.body, lambda n: wide.get(n) if isinstance(n, ir.Buffer) else None)
    names = ", ".join(sorted(b.name for b in fp8))
    kernel = dataclasses.replace(kernel, body=body)
    return kernel.with_note(f"legalize_metal: shared FP8 tiles {names} hold float16 (decoded on copy)")


# ----------------------------------------------------------------------------------------------
# storage


@dataclasses.dataclass
class _Use:
    kind: str                     # fill | copy | gemm_c | operand | reduce (and scan) | par | thread
                                  # (in a per-thread T.Parallel) | uniform | atomic
    whole: bool = True
    aligned: bool = False         # par: the loop's own indices over exactly the buffer's shape;
                                  # thread: the loop's own thread indices in front
    write: bool = False
    other: Optional[ir.Region] = None   # copy: the other side


class _Uses:
    """Every access of each fragment / local buffer, in program order."""

    def __init__(self, thread_shape: tuple[int, ...]):
        self.thread_shape = thread_shape
        self.buffers: dict[str, ir.Buffer] = {}
        self.of: dict[str, list[_Use]] = {}
        # per T.Parallel: the fragments it touches, and whether always at its own indices
        self.pars: dict[int, dict[str, bool]] = {}

    def add(self, b: ir.Buffer, use: _Use) -> None:
        if b.scope in ON_CHIP:
            self.buffers[b.name] = b
            self.of.setdefault(b.name, []).append(use)

    def stmt(self, s: ir.Stmt, par: Optional[ir.Parallel]) -> None:
        if isinstance(s, ir.Seq):
            for t in s.stmts:
                self.stmt(t, par)
            return
        if isinstance(s, ir.Alloc) and s.buffer.scope in ON_CHIP:
            self.buffers[s.buffer.name] = s.buffer
            self.of.setdefault(s.buffer.name, [])
        elif isinstance(s, ir.Copy):
            self.add(s.src.buffer, _Use("copy", s.src.is_whole, other=s.dst))
            self.add(s.dst.buffer, _Use("copy", s.dst.is_whole, write=True, other=s.src))
        elif isinstance(s, ir.Gemm):
            self.add(s.a.buffer, _Use("operand"))
            self.add(s.b.buffer, _Use("operand"))
            self.add(s.c.buffer, _Use("gemm_c", s.c.is_whole, write=True))
        elif isinstance(s, ir.Fill):
            self.add(s.dst.buffer, _Use("fill", s.dst.is_whole, write=True))
        elif isinstance(s, (ir.Reduce, ir.CumSum)):
            self.add(s.src, _Use("reduce"))
            self.add(s.dst, _Use("reduce", write=True))
        elif isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region):
            self.add(s.value.buffer, _Use("atomic", s.value.is_whole))
        if isinstance(s, ir.Parallel):
            par = s
        if isinstance(s, ir.Store):
            self._element(s.buffer, s.indices, par, write=True)
        for e in exprs_of(s):
            for x in subexprs(e):
                if isinstance(x, ir.Load):
                    self._element(x.buffer, x.indices, par, write=False)
        for body in substmts(s):
            self.stmt(body, par)

    def _element(self, b: ir.Buffer, indices, par: Optional[ir.Parallel], write: bool) -> None:
        if par is None:
            self.add(b, _Use("uniform", write=write))
            return
        if par.per_thread:
            n = len(self.thread_shape)
            own = (tuple(indices[:n]) == tuple(par.vars[:n])
                   and b.static_shape[:n] == self.thread_shape)
            self.add(b, _Use("thread", aligned=own, write=write))
            return
        aligned = (tuple(indices) == tuple(par.vars) and b.scope in ON_CHIP
                   and tuple(par.extents) == b.static_shape)
        self.add(b, _Use("par", aligned=aligned, write=write))
        if b.scope in ON_CHIP:
            members = self.pars.setdefault(id(par), {})
            members[b.name] = members.get(b.name, True) and aligned


def _decide(uses: _Uses, tilings: dict) -> dict[str, str]:
    storage = {}
    for name, b in uses.buffers.items():
        us = uses.of[name]
        storage[name] = ("matrix" if _matrix(b, us, tilings.get(name)) else "private" if _private(us)
                         else "registers" if _registers(us) else "replicated" if _replicated(b, us)
                         else "shared")
    changed = True
    while changed:
        changed = False
        # a T.Parallel over a matrix buffer runs per simdgroup tile: the fragments it touches at
        # its own indices join the matrices (same shape, so the same tiling) where they can, and
        # move to shared memory where they cannot
        for members in uses.pars.values():
            tiling = next((tilings[n] for n in members if storage[n] == "matrix"), None)
            if tiling is None:
                continue
            for n, aligned in members.items():
                if storage[n] != "registers":
                    continue
                b = uses.buffers[n]
                joins = aligned and _matrix(b, uses.of[n], tiling)
                storage[n] = "matrix" if joins else "shared"
                if joins:
                    tilings[n] = tiling
                changed = True
        # a registers (private) copy needs the same layout on the other side
        for name, us in uses.of.items():
            b = uses.buffers[name]
            if storage[name] in ("registers", "private") and not all(
                    _same_layout(b, u, storage) for u in us):
                storage[name] = "shared"
                changed = True
    return storage


def _matrix(b: ir.Buffer, us: list[_Use], tiling: Optional[MatrixTiling]) -> bool:
    """Whether ``b`` can be held as simdgroup matrices of ``tiling`` (its gemm's, or that of a
    matrix buffer a T.Parallel touches with it): an accumulator type, and only whole fills,
    gemm accumulation, whole copies out to global or shared memory, and T.Parallel accesses at
    the loop's own indices."""
    if tiling is None or b.dtype not in ACCUMULATORS or len(b.shape) != 2:
        return False
    return all(u.kind == "par" and u.aligned
               or u.whole and (u.kind in ("gemm_c", "fill") or u.kind == "copy" and not u.write
                               and u.other.buffer.scope in (ir.Scope.GLOBAL, ir.Scope.SHARED))
               for u in us)


def _private(us: list[_Use]) -> bool:
    """Whether every thread can keep its own part of the buffer: accessed by per-thread T.Parallel
    loops at their own thread's indices (at least once), otherwise filled or copied whole."""
    return any(u.kind == "thread" for u in us) and all(
        u.kind == "thread" and u.aligned or u.whole and u.kind in ("fill", "copy") for u in us)


def _registers(us: list[_Use]) -> bool:
    return all(u.whole and u.kind in ("fill", "copy", "atomic") or u.kind == "par" and u.aligned
               for u in us)


def _replicated(b: ir.Buffer, us: list[_Use]) -> bool:
    return b.nbytes <= REPLICATED_MAX_BYTES and all(
        u.kind == "uniform" or u.kind == "fill" and u.whole
        or u.kind in ("par", "thread") and not u.write
        or u.kind == "copy" and not u.write for u in us)


def _same_layout(b: ir.Buffer, u: _Use, storage: dict[str, str]) -> bool:
    """A copy between ``b`` (held in registers, or private) and another buffer pairs the same
    elements in the same threads: for registers, the other is global, in shared memory, or a whole
    buffer of ``b``'s shape held in registers; for private, a whole private buffer of ``b``'s
    shape."""
    mine = storage[b.name]
    if u.kind != "copy" or u.other.buffer.scope not in ON_CHIP and mine == "registers":
        return True
    other = u.other.buffer
    same = u.other.is_whole and other.static_shape == b.static_shape
    if mine == "private":
        return other.scope in ON_CHIP and storage[other.name] == "private" and same
    return storage[other.name] == "shared" or storage[other.name] == "registers" and same


# ----------------------------------------------------------------------------------------------
# how the statements over fragments run


class _Statements:
    """The per-statement decisions of the plan (``matrix_copies``, ``reductions``, ``parallels``),
    each by the key the plan reads it by, and the scratch they need."""

    def __init__(self, kernel: ir.Kernel, storage: dict[str, str], simdgroups: int):
        self.tables: dict[str, dict] = {"copies": {}, "reductions": {}, "parallels": {}}
        self.slots: dict[ir.DType, int] = {}
        for s in walk(kernel.body):
            if isinstance(s, ir.Copy) and storage.get(s.src.buffer.name) == "matrix":
                staged = _staged(s)
                self._decide("copies", FragmentStoragePlan.copy_key(s), staged, s)
                if staged:
                    self._need(s.src.buffer.dtype, 1)
            elif isinstance(s, ir.Reduce):
                per = _simdgroups_per_output(s, simdgroups)
                self._decide("reductions", s.dst.name, per, s)
                if per > 1:
                    self._need(ir.DType.F32, 1)
            elif isinstance(s, ir.Parallel):
                matrices = _matrix_buffers(s, storage)
                loop = tuple((b.name, b.dtype, sum(c.dtype == b.dtype for c in matrices[:k]))
                             for k, b in enumerate(matrices))
                self._decide("parallels", FragmentStoragePlan.parallel_key(s), loop, s)
                for dtype in {b.dtype for b in matrices}:
                    self._need(dtype, sum(b.dtype == dtype for b in matrices))

    def _decide(self, table: str, key, value, s: ir.Stmt) -> None:
        if self.tables[table].setdefault(key, value) != value:
            raise InternalError(f"legalize_metal: two statements keyed {key!r} are decided "
                                f"differently", s.loc)

    def _need(self, dtype: ir.DType, n: int) -> None:
        self.slots[dtype] = max(self.slots.get(dtype, 0), n)

    def table(self, name: str) -> tuple:
        return tuple(sorted(self.tables[name].items(), key=lambda kv: repr(kv[0])))

    def scratch(self) -> tuple:
        """(element type, 64-element slots per simdgroup) of the staging areas: a slot of the
        accumulator's type for a staged matrix copy, one of float32 for a reduction across
        simdgroups, and per T.Parallel over matrix buffers one slot for each of them."""
        return tuple(sorted(self.slots.items(), key=lambda kv: kv[0].value))


def _staged(s: ir.Copy) -> bool:
    """Whether a copy out of a matrix accumulator goes through the simdgroup's scratch area (it
    masks, converts, or writes a destination whose rows are not contiguous); else it stores the
    matrices straight to the destination."""
    dims = [d for d, n in enumerate(s.dst.extents) if n != 1]
    return (s.mechanism is not ir.CopyMechanism.DIRECT or s.dst.buffer.dtype != s.src.buffer.dtype
            or dims[-1] != len(s.dst.extents) - 1)


def _matrix_buffers(s: ir.Parallel, storage: dict[str, str]) -> list[ir.Buffer]:
    """The matrix buffers a T.Parallel touches, in a fixed order (their scratch slots)."""
    found = {b.name: b for t in walk(s) for b, _ in element_accesses(t)
             if storage.get(b.name) == "matrix"}
    return [found[n] for n in sorted(found)]


def _simdgroups_per_output(s: ir.Reduce, simdgroups: int) -> int:
    """How many simdgroups reduce each output of ``s`` together: one (each simdgroup takes whole
    outputs) unless there are fewer outputs than simdgroups and the values are floats, then all
    simdgroups share the outputs, combining their partials through scratch."""
    shape = s.src.static_shape
    outputs = math.prod(shape) // shape[s.dim]
    return simdgroups // outputs if outputs < simdgroups and s.dst.dtype.is_float else 1
