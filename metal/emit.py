"""The MSL emitter: a kernel lowered for Metal -> an ``MslKernel`` (``metal/source.py``).

It spells what lowering decided and decides nothing: where each fragment lives, how the
simdgroups share a gemm's accumulator, which copies out of it stage through scratch, how many
simdgroups share each output of a reduction, which ``T.Parallel`` loops run per simdgroup tile and
the scratch slots they use (``FragmentStoragePlan``, made by ``legalize_metal``, which also refused
what Metal cannot run: this module raises only ``InternalError``), where the block barriers go
(``BlockSync``), which copies mask (``Copy.mechanism``). One threadgroup runs one block of
``kernel.threads`` threads:

* thread ``t`` is ``tws_tid``; simdgroup ``tws_sg = t / 32``, lane ``tws_lane = t % 32``;
* whole-tile statements (copies, fills) and ``T.Parallel`` loops hand flat element ``e`` to thread
  ``e % threads`` (its slot ``e / threads``: where a registers buffer keeps that element);
* a per-thread ``T.Parallel`` (``per_thread``) runs thread ``t``'s own iteration in thread ``t``:
  its thread vars (the plan's ``thread_shape``, slowest first) are ``t``'s digits, its other vars
  a loop in the thread; a private buffer keeps the thread's own elements, indexed by the indices
  after the thread indices;
* shared buffers and fragments held in shared memory are ``threadgroup`` arrays declared at the
  top of the body; registers, private, replicated and matrix buffers are thread-local arrays;
* ``T.gemm``: each simdgroup of the accumulator's tiling multiplies its own 8x8 tiles with
  ``simdgroup_multiply_accumulate``, operands loaded from threadgroup memory (transposes by the
  load's flag); an accumulator in shared memory is loaded before and stored after;
* a matrix accumulator is copied out with ``simdgroup_store`` straight to its destination when the
  copy needs no mask and no conversion, else staged 8x8 at a time through a per-simdgroup scratch
  area whose lanes convert and mask;
* ``T.cumsum``: each thread scans whole lines of the dim serially (both buffers in shared memory);
* reductions: a simdgroup per output (lanes stride the reduced dim, then ``simd_sum``/``simd_max``/
  ``simd_min``), or, with fewer outputs than simdgroups, every simdgroup's partial into scratch and a
  second step across them;
* statements outside ``T.Parallel`` that store one element (global or shared) run on thread 0;
  replicated buffers are written by every thread alike;
* atomic adds: ``atomic_fetch_add_explicit`` on the element as a ``device`` or ``threadgroup``
  atomic; a float32 add into threadgroup memory (Metal has no float atomics there) is a
  compare-and-swap loop on the element's bits (``tws_atomic_add_threadgroup``).

Every statement is preceded by a ``// tilews: file.py:LINE`` comment.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable

from tilews.lowering import ir
from tilews.lowering.errors import InternalError
from tilews.lowering.plans import MatrixTiling
from tilews.lowering.simplify import nonneg
from tilews.lowering.traverse import buffers_read, buffers_written, walk

from .context import LANE, SG, TID, Ctx, ParallelFrame, msl_type
from .exprs import as_type, convert, decoded, element, in_bounds, offset, read, spell, strides
from .source import MslKernel, MslParam

MATRIX = 8
SCRATCH = MATRIX * MATRIX            # elements of the per-simdgroup scratch area
_GRID = ("x", "y", "z")


def emit(kernel: ir.Kernel) -> MslKernel:
    ctx = Ctx(kernel)
    params = _prelude(ctx, kernel)
    _declarations(ctx, kernel)
    stmt(ctx, kernel.body)
    header = "".join(sorted(ctx.helpers))
    return MslKernel(name=ctx.name(kernel.name), header=header, body="\n".join(ctx.lines) + "\n",
                     params=params, attributes=("threadgroup_position_in_grid",
                                                "thread_index_in_threadgroup",
                                                "simdgroup_index_in_threadgroup",
                                                "thread_index_in_simdgroup"),
                     threads=kernel.threads)


def _prelude(ctx: Ctx, kernel: ir.Kernel) -> tuple[MslParam, ...]:
    written = {b.name for s in walk(kernel.body) for b in buffers_written(s)}
    read_ = {b.name for s in walk(kernel.body) for b in buffers_read(s)}
    ctx.name(kernel.name)
    ctx.line(f"const uint {TID} = thread_index_in_threadgroup;")
    ctx.line(f"const uint {SG} = simdgroup_index_in_threadgroup;")
    ctx.line(f"const uint {LANE} = thread_index_in_simdgroup;")
    params = []
    for p in kernel.params:
        if isinstance(p, ir.Buffer):
            params.append(MslParam(ctx.name(p.name), msl_type(p.dtype, p.loc), p.name in written,
                                   read=p.name in read_))
        else:
            arg = ctx.name(p.name + "_arg")
            params.append(MslParam(arg, msl_type(p.dtype, p.loc), False, scalar=True))
            ctx.line(f"const {msl_type(p.dtype, p.loc)} {ctx.name(p.name)} = {arg}[0];")
    for v, axis in zip(kernel.block_vars, _GRID):
        ctx.line(f"const int {ctx.name(v.name)} = int(threadgroup_position_in_grid.{axis});")
    for v, e in kernel.block_defs:
        ctx.line(f"const int {ctx.name(v.name)} = {spell(ctx, e)};")
    return tuple(params)


def _declarations(ctx: Ctx, kernel: ir.Kernel) -> None:
    """Every on-chip buffer, declared once at the top of the body (threadgroup arrays must be)."""
    for s in walk(kernel.body):
        if not isinstance(s, ir.Alloc) or s.buffer.scope is ir.Scope.BARRIER:
            continue
        b = s.buffer
        name, where = ctx.name(b.name), ctx.where(b)
        t = msl_type(b.dtype, s.loc)
        n = math.prod(b.static_shape)
        if where == "shared":
            ctx.line(f"threadgroup {t} {name}[{n}];")
        elif where == "registers":
            ctx.line(f"{t} {name}[{ctx.slots(b)}];")
        elif where == "private":
            ctx.line(f"{t} {name}[{ctx.private_size(b)}];")
        elif where == "replicated":
            ctx.line(f"{t} {name}[{n}];")
        else:
            tiling = ctx.storage.tiling(b.name)
            ctx.line(f"simdgroup_matrix<{t}, 8, 8> {name}[{tiling.tiles_m * tiling.tiles_n}];")
    for t, slots in ctx.storage.scratch:
        ctx.line(f"threadgroup {msl_type(t, kernel.loc)} {_scratch(t)}[{ctx.simdgroups * slots * SCRATCH}];")


def _scratch(t: ir.DType) -> str:
    return f"tws_scratch_{t.value}"


def _slot(ctx: Ctx, t: ir.DType, k: int) -> str:
    """This simdgroup's ``k``-th 64-element staging slot of type ``t``."""
    slots = dict(ctx.storage.scratch)[t]
    first = f"{SG} * {slots}" if slots > 1 else SG
    return f"{_scratch(t)} + ({first} + {k}) * {SCRATCH}" if k else f"{_scratch(t)} + {first} * {SCRATCH}"


def stmt(ctx: Ctx, s: ir.Stmt) -> None:
    if isinstance(s, ir.Seq):
        for t in s.stmts:
            stmt(ctx, t)
        return
    rule = _STMTS.get(type(s))
    if rule is None:
        raise InternalError(f"metal backend: no rule for {type(s).__name__} (lowering should have "
                            f"removed or rejected it)", s.loc)
    if not isinstance(s, ir.Alloc):
        ctx.origin(s.loc)
    rule(ctx, s)


# ----------------------------------------------------------------------------------------------
# element loops and regions


@contextlib.contextmanager
def each_element(ctx: Ctx, total: int):
    """A cooperative loop: thread t takes flat elements t, t + threads, ...; yields (flat index,
    slot) names."""
    slot, e = ctx.fresh("s"), ctx.fresh("e")
    slots = -(-total // ctx.threads)
    with ctx.block(f"for (int {slot} = 0; {slot} < {slots}; ++{slot})"):
        ctx.line(f"const int {e} = int({TID}) + {slot} * {ctx.threads};")
        if total % ctx.threads:
            with ctx.block(f"if ({e} < {total})"):
                yield e, slot
        else:
            yield e, slot


def region_indices(ctx: Ctx, r: ir.Region, flat: str) -> list[str]:
    """Per-dim indices of the region's element at flat index ``flat`` of its tile."""
    out = [spell(ctx, s) for s in r.starts]
    dims = [d for d, n in enumerate(r.extents) if n != 1]
    rest = 1
    for k, d in reversed(list(enumerate(dims))):
        idx = flat if rest == 1 else f"({flat} / {rest})"
        if k:
            idx = f"({idx} % {r.extents[d]})"
        out[d] = idx if out[d] == "0" else f"({out[d]} + {idx})"
        rest *= r.extents[d]
    return out


def _side(ctx: Ctx, r: ir.Region, flat: str, slot: str) -> tuple[str, list[str]]:
    """(lvalue, indices) of a copy side's element at flat tile index ``flat`` (this thread's
    ``slot``)."""
    if ctx.where(r.buffer) == "registers":
        return f"{ctx.name(r.buffer.name)}[{slot}]", []
    indices = region_indices(ctx, r, flat)
    return element(ctx, r.buffer, indices), indices


def _source(ctx: Ctx, r: ir.Region, flat: str, slot: str, mask_low, decode: bool) -> str:
    """The value of a copy source's element at flat tile index ``flat`` (this thread's ``slot``):
    ``read``'s, with ``mask_low`` and ``decode`` as there; a registers buffer's own slot."""
    if ctx.where(r.buffer) == "registers":
        value = f"{ctx.name(r.buffer.name)}[{slot}]"
        return decoded(ctx, value, r.buffer.dtype) if decode else value
    return read(ctx, r.buffer, region_indices(ctx, r, flat), mask_low, decode=decode)


def _tile_size(r: ir.Region) -> int:
    return math.prod(r.tile_shape)


# ----------------------------------------------------------------------------------------------
# statements


def _alloc(ctx: Ctx, s: ir.Alloc) -> None:
    """Declared at the top of the body (``_declarations``)."""


def _copy(ctx: Ctx, s: ir.Copy) -> None:
    if s.mechanism not in (ir.CopyMechanism.DIRECT, ir.CopyMechanism.MASKED):
        raise InternalError(f"metal backend: no rule for copy mechanism {s.mechanism.value}", s.loc)
    src, dst = s.src, s.dst
    if ctx.where(src.buffer) == "matrix":
        _matrix_copy(ctx, s)
        return
    masked = s.mechanism is ir.CopyMechanism.MASKED
    same = src.buffer.dtype == dst.buffer.dtype
    if ctx.where(dst.buffer) == "private":      # from a private buffer of its shape (legalize_metal)
        n = ctx.fresh("i")
        value = f"{ctx.name(src.buffer.name)}[{n}]"
        with ctx.block(f"for (int {n} = 0; {n} < {ctx.private_size(dst.buffer)}; ++{n})"):
            value = value if same else convert(ctx, decoded(ctx, value, src.buffer.dtype),
                                               dst.buffer.dtype, s.loc)
            ctx.line(f"{ctx.name(dst.buffer.name)}[{n}] = {value};")
        return
    with each_element(ctx, _tile_size(src)) as (e, slot):
        value = _source(ctx, src, e, slot, src.mask_low if masked else None, decode=not same)
        if not same:
            value = convert(ctx, value, dst.buffer.dtype, s.loc)
        target, indices = _side(ctx, dst, e, slot)
        cond = in_bounds(ctx, dst.buffer, indices, dst.mask_low) if masked and indices and \
            dst.buffer.scope is ir.Scope.GLOBAL else None
        ctx.line(f"if ({cond}) {target} = {value};" if cond else f"{target} = {value};")


def _fill(ctx: Ctx, s: ir.Fill) -> None:
    b = s.dst.buffer
    where = ctx.where(b)
    value = as_type(ctx, s.value, b.dtype, s.loc)
    name = ctx.name(b.name)
    if where == "matrix":
        t = ctx.storage.tiling(b.name)
        _fill_matrix(ctx, name, t.tiles_m * t.tiles_n, msl_type(b.dtype, s.loc), value)
        return
    if where in ("registers", "private", "replicated"):
        n = ctx.fresh("i")
        count = (ctx.slots(b) if where == "registers" else ctx.private_size(b) if where == "private"
                 else math.prod(b.static_shape))
        with ctx.block(f"for (int {n} = 0; {n} < {count}; ++{n})"):
            ctx.line(f"{name}[{n}] = {value};")
        return
    with each_element(ctx, _tile_size(s.dst)) as (e, slot):
        target, indices = _side(ctx, s.dst, e, slot)
        cond = in_bounds(ctx, b, indices, s.dst.mask_low) if b.scope is ir.Scope.GLOBAL else None
        ctx.line(f"if ({cond}) {target} = {value};" if cond else f"{target} = {value};")


# -- gemm ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _simdgroup_tile(ctx: Ctx, tiling: MatrixTiling):
    """The simdgroups owning tiles of ``tiling``; yields the (row, column) of this simdgroup's
    first element in the accumulator tile."""
    head = f"if ({SG} < {tiling.simdgroups})" if tiling.simdgroups < ctx.simdgroups else ""
    with ctx.block(head):
        row, col = ctx.fresh("row"), ctx.fresh("col")
        ctx.line(f"const int {row} = int({SG}) / {tiling.warps_n} * {8 * tiling.tiles_m};")
        ctx.line(f"const int {col} = int({SG}) % {tiling.warps_n} * {8 * tiling.tiles_n};")
        yield row, col


def _operand_ptr(ctx: Ctx, r: ir.Region) -> tuple[str, int]:
    """(pointer to the region's first element, elements per row) of a 2-d tile operand."""
    base = ctx.name(r.buffer.name)
    off = offset(ctx, r.buffer, [spell(ctx, x) for x in r.starts])
    return (base if off == "0" else f"({base} + {off})"), r.buffer.static_shape[-1]


def _gemm(ctx: Ctx, s: ir.Gemm) -> None:
    if s.instr is not ir.GemmInstr.DOT:
        raise InternalError(f"metal backend: no rule for gemm instruction {s.instr.value}", s.loc)
    c = s.c.buffer
    tiling = ctx.storage.tiling(c.name)
    tm, tn = tiling.tiles_m, tiling.tiles_n
    acc_t = msl_type(c.dtype, s.loc)
    op_t = msl_type(s.a.buffer.dtype, s.loc)
    k_extent = s.a.extents[-2] if s.transpose_a else s.a.extents[-1]
    a_ptr, lda = _operand_ptr(ctx, s.a)
    b_ptr, ldb = _operand_ptr(ctx, s.b)
    in_matrix = ctx.where(c) == "matrix"
    with _simdgroup_tile(ctx, tiling) as (row, col):
        if in_matrix:
            acc = ctx.name(c.name)
            if s.clear_accum:
                _fill_matrix(ctx, acc, tm * tn, acc_t, f"{acc_t}(0)")
        else:
            acc = ctx.fresh("acc")
            c_ptr, ldc = _operand_ptr(ctx, s.c)
            ctx.line(f"simdgroup_matrix<{acc_t}, 8, 8> {acc}[{tm * tn}];")
            if s.clear_accum:
                _fill_matrix(ctx, acc, tm * tn, acc_t, f"{acc_t}(0)")
            else:
                for i in range(tm):
                    for j in range(tn):
                        ctx.line(f"simdgroup_load({acc}[{i * tn + j}], {c_ptr}, {ldc}, "
                                 f"ulong2({col} + {8 * j}, {row} + {8 * i}));")
        k = ctx.fresh("k")
        a_m, b_m = ctx.fresh("a"), ctx.fresh("b")
        with ctx.block(f"for (int {k} = 0; {k} < {k_extent}; {k} += 8)"):
            ctx.line(f"simdgroup_matrix<{op_t}, 8, 8> {a_m}[{tm}];")
            ctx.line(f"simdgroup_matrix<{op_t}, 8, 8> {b_m}[{tn}];")
            for i in range(tm):
                r = f"{row} + {8 * i}"
                origin = f"ulong2({r}, {k})" if s.transpose_a else f"ulong2({k}, {r})"
                ctx.line(f"simdgroup_load({a_m}[{i}], {a_ptr}, {lda}, {origin}, "
                         f"{'true' if s.transpose_a else 'false'});")
            for j in range(tn):
                cc = f"{col} + {8 * j}"
                origin = f"ulong2({k}, {cc})" if s.transpose_b else f"ulong2({cc}, {k})"
                ctx.line(f"simdgroup_load({b_m}[{j}], {b_ptr}, {ldb}, {origin}, "
                         f"{'true' if s.transpose_b else 'false'});")
            for i in range(tm):
                for j in range(tn):
                    t = f"{acc}[{i * tn + j}]"
                    ctx.line(f"simdgroup_multiply_accumulate({t}, {a_m}[{i}], {b_m}[{j}], {t});")
        if not in_matrix:
            for i in range(tm):
                for j in range(tn):
                    ctx.line(f"simdgroup_store({acc}[{i * tn + j}], {c_ptr}, {ldc}, "
                             f"ulong2({col} + {8 * j}, {row} + {8 * i}));")


def _fill_matrix(ctx: Ctx, name: str, count: int, t: str, value: str) -> None:
    """Each of the ``count`` simdgroup matrices ``name[...]`` of element type ``t`` set to
    ``value``."""
    n = ctx.fresh("t")
    with ctx.block(f"for (int {n} = 0; {n} < {count}; ++{n})"):
        ctx.line(f"{name}[{n}] = make_filled_simdgroup_matrix<{t}, 8, 8>({value});")


def _matrix_copy(ctx: Ctx, s: ir.Copy) -> None:
    """A matrix accumulator out to global or shared memory, each simdgroup its own tiles."""
    src, dst = s.src, s.dst
    b = src.buffer
    tiling = ctx.storage.tiling(b.name)
    dims = [d for d, n in enumerate(dst.extents) if n != 1]
    direct = not ctx.storage.staged(s)
    starts = [spell(ctx, x) for x in dst.starts]
    name = ctx.name(b.name)
    with _simdgroup_tile(ctx, tiling) as (row, col):
        for i in range(tiling.tiles_m):
            for j in range(tiling.tiles_n):
                tile = f"{name}[{i * tiling.tiles_n + j}]"
                r0, c0 = f"{row} + {8 * i}", f"{col} + {8 * j}"
                if direct:
                    idx = list(starts)
                    idx[dims[0]] = f"({idx[dims[0]]} + {r0})"
                    idx[dims[1]] = f"({idx[dims[1]]} + {c0})"
                    ld = strides(ctx, dst.buffer)[dims[0]]
                    ptr = f"({ctx.name(dst.buffer.name)} + {offset(ctx, dst.buffer, idx)})"
                    ctx.line(f"simdgroup_store({tile}, {ptr}, ulong({ld}));")
                    continue
                scratch = _slot(ctx, b.dtype, 0)
                ctx.line(f"simdgroup_store({tile}, {scratch}, 8);")
                ctx.line("simdgroup_barrier(mem_flags::mem_threadgroup);")
                q = ctx.fresh("q")
                with ctx.block(f"for (int {q} = int({LANE}); {q} < {SCRATCH}; {q} += {ctx.lanes})"):
                    idx = list(starts)
                    idx[dims[0]] = f"({idx[dims[0]]} + {r0} + {q} / 8)"
                    idx[dims[1]] = f"({idx[dims[1]]} + {c0} + {q} % 8)"
                    value = f"({scratch})[{q}]"
                    if dst.buffer.dtype != b.dtype:
                        value = convert(ctx, value, dst.buffer.dtype, s.loc)
                    target = element(ctx, dst.buffer, idx)
                    cond = (in_bounds(ctx, dst.buffer, idx, dst.mask_low)
                            if s.mechanism is ir.CopyMechanism.MASKED else None)
                    ctx.line(f"if ({cond}) {target} = {value};" if cond else f"{target} = {value};")
                ctx.line("simdgroup_barrier(mem_flags::mem_threadgroup);")


# -- reductions ---------------------------------------------------------------------------------

_COMBINE = {ir.ReduceKind.MAX: "max({}, {})", ir.ReduceKind.MIN: "min({}, {})",
            ir.ReduceKind.SUM: "({} + {})", ir.ReduceKind.ABSSUM: "({} + {})",
            ir.ReduceKind.ABSMAX: "max({}, {})"}
_SIMD = {ir.ReduceKind.MAX: "simd_max", ir.ReduceKind.MIN: "simd_min", ir.ReduceKind.SUM: "simd_sum",
         ir.ReduceKind.ABSSUM: "simd_sum", ir.ReduceKind.ABSMAX: "simd_max"}


def _accumulator(dt: ir.DType) -> str:
    """The MSL type reductions and scans of ``dt`` values accumulate in."""
    return "float" if dt.is_float else "int" if dt.record.kind != "uint" else "uint"


def _identity(kind: ir.ReduceKind, t: str) -> str:
    if kind in (ir.ReduceKind.MAX, ir.ReduceKind.ABSMAX):
        return "(-INFINITY)" if t == "float" else "(-2147483647 - 1)"
    if kind is ir.ReduceKind.MIN:
        return "INFINITY" if t == "float" else "2147483647"
    return f"{t}(0)"


def _reduce(ctx: Ctx, s: ir.Reduce) -> None:
    src, dst = s.src, s.dst
    shape = src.static_shape
    red = shape[s.dim]
    post = math.prod(shape[s.dim + 1:])
    outputs = math.prod(shape) // red
    acc_t = _accumulator(dst.dtype)
    combine = _COMBINE[s.kind]
    src_name, dst_name = ctx.name(src.name), ctx.name(dst.name)

    def element_of(o: str, r: str) -> str:
        value = f"{acc_t}({src_name}[({o} / {post}) * {red * post} + ({r}) * {post} + {o} % {post}])"
        return f"abs({value})" if s.kind.of_abs else value

    def result(o: str, v: str) -> str:
        old = f"{acc_t}({dst_name}[{o}])"
        out = v if s.clear else combine.format(old, v)
        return f"{dst_name}[{o}] = {convert(ctx, out, dst.dtype, s.loc)};"

    per = ctx.storage.simdgroups_per_output(s)
    o, v, r = ctx.fresh("o"), ctx.fresh("v"), ctx.fresh("r")
    if per == 1:
        with ctx.block(f"for (int {o} = int({SG}); {o} < {outputs}; {o} += {ctx.simdgroups})"):
            ctx.line(f"{acc_t} {v} = {_identity(s.kind, acc_t)};")
            with ctx.block(f"for (int {r} = int({LANE}); {r} < {red}; {r} += {ctx.lanes})"):
                ctx.line(f"{v} = {combine.format(v, element_of(o, r))};")
            ctx.line(f"{v} = {_SIMD[s.kind]}({v});")
            ctx.line(f"if ({LANE} == 0) {result(o, v)}")
        return
    scratch = _scratch(ir.DType.F32)
    with ctx.block():
        ctx.line(f"const int {o} = int({SG}) / {per};")
        ctx.line(f"{acc_t} {v} = {_identity(s.kind, acc_t)};")
        with ctx.block(f"if ({o} < {outputs})"):
            with ctx.block(f"for (int {r} = int({SG}) % {per} * {ctx.lanes} + int({LANE}); "
                           f"{r} < {red}; {r} += {per * ctx.lanes})"):
                ctx.line(f"{v} = {combine.format(v, element_of(o, r))};")
        ctx.line(f"{v} = {_SIMD[s.kind]}({v});")
        ctx.line(f"if ({LANE} == 0) {scratch}[{SG}] = {v};")
        ctx.line("threadgroup_barrier(mem_flags::mem_threadgroup);")
        with ctx.block(f"if ({TID} < {outputs})"):
            w, g = ctx.fresh("w"), ctx.fresh("g")
            ctx.line(f"{acc_t} {w} = {scratch}[{TID} * {per}];")
            with ctx.block(f"for (int {g} = 1; {g} < {per}; ++{g})"):
                ctx.line(f"{w} = {combine.format(w, f'{scratch}[{TID} * {per} + {g}]')};")
            ctx.line(result(TID, w))
        ctx.line("threadgroup_barrier(mem_flags::mem_threadgroup);")


def _cumsum(ctx: Ctx, s: ir.CumSum) -> None:
    """Serial along the scanned dim: thread ``t`` scans lines t, t + threads, ... (a line: the
    dim's ``n`` elements at one index of every other dim), both buffers in threadgroup memory
    (legalize_metal). Each element is read before it is written, so the scan may be in place.
    A thread makes ceil(lines / threads) * n additions: meant for the small tiles of a block."""
    shape = s.src.static_shape
    n, post = shape[s.dim], math.prod(shape[s.dim + 1:])
    acc_t = _accumulator(s.dst.dtype)
    src, dst = ctx.name(s.src.name), ctx.name(s.dst.name)
    line, r, v, at = ctx.fresh("line"), ctx.fresh("r"), ctx.fresh("v"), ctx.fresh("at")
    order = f"int {r} = {n - 1}; {r} >= 0; --{r}" if s.reverse else f"int {r} = 0; {r} < {n}; ++{r}"
    with ctx.block(f"for (int {line} = int({TID}); {line} < {math.prod(shape) // n}; "
                   f"{line} += {ctx.threads})"):
        ctx.line(f"{acc_t} {v} = {acc_t}(0);")
        with ctx.block(f"for ({order})"):
            ctx.line(f"const int {at} = ({line} / {post}) * {n * post} + {r} * {post} + {line} % {post};")
            ctx.line(f"{v} += {acc_t}({decoded(ctx, f'{src}[{at}]', s.src.dtype)});")
            ctx.line(f"{dst}[{at}] = {convert(ctx, v, s.dst.dtype, s.loc)};")


# -- element statements -------------------------------------------------------------------------


def _store(ctx: Ctx, s: ir.Store) -> None:
    b = s.buffer
    indices = [spell(ctx, i) for i in s.indices]
    value = as_type(ctx, s.value, b.dtype, s.loc)
    target = element(ctx, b, indices)
    cond = in_bounds(ctx, b, indices, s.mask_low) if b.scope is ir.Scope.GLOBAL else None
    text = f"if ({cond}) {target} = {value};" if cond else f"{target} = {value};"
    if ctx.par is None and ctx.where(b) != "replicated":
        text = f"if ({TID} == 0) {{ {text} }}"
    ctx.line(text)


_ATOMIC = {ir.DType.F32: "atomic_float", ir.DType.I32: "atomic_int", ir.DType.U32: "atomic_uint"}
_SPACES = {ir.Scope.GLOBAL: "device", ir.Scope.SHARED: "threadgroup"}

# Metal has atomic floats in device memory only: in threadgroup memory, a compare-and-swap loop on
# the element's bits
ATOMIC_ADD_THREADGROUP_FLOAT = """inline void tws_atomic_add_threadgroup(threadgroup float* at, float v) {
  threadgroup atomic_uint* bits = (threadgroup atomic_uint*)at;
  uint seen = atomic_load_explicit(bits, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(bits, &seen, as_type<uint>(as_type<float>(seen) + v),
                                                memory_order_relaxed, memory_order_relaxed)) {}
}
"""


def _atomic(ctx: Ctx, b: ir.Buffer, indices: list[str], value: str, mask_low, loc: ir.Loc) -> str:
    kind, space = _ATOMIC.get(b.dtype), _SPACES.get(b.scope)
    if kind is None or space is None:
        raise InternalError(f"metal backend: no atomic add into '{b.name}' ({b.scope.value}, "
                            f"{b.dtype}) (legalize_metal should have refused it)", loc)
    at = f"{ctx.name(b.name)} + {offset(ctx, b, indices)}"
    if b.scope is ir.Scope.SHARED and b.dtype is ir.DType.F32:
        ctx.helpers.add(ATOMIC_ADD_THREADGROUP_FLOAT)
        text = f"tws_atomic_add_threadgroup({at}, {value});"
    else:
        text = f"atomic_fetch_add_explicit(({space} {kind}*)({at}), {value}, memory_order_relaxed);"
    cond = in_bounds(ctx, b, indices, mask_low) if b.scope is ir.Scope.GLOBAL else None
    return f"if ({cond}) {text}" if cond else text


def _atomic_add(ctx: Ctx, s: ir.AtomicAdd) -> None:
    b = s.dst.buffer
    if s.prev is not None or s.order != "relaxed":
        raise InternalError(f"metal backend: no rule for an atomic add that returns its previous "
                            f"value or orders memory ({s.order}); legalize_metal should have refused "
                            f"it", s.loc)
    if isinstance(s.value, ir.Region):
        src = s.value
        with each_element(ctx, _tile_size(src)) as (e, slot):
            value = convert(ctx, _source(ctx, src, e, slot, src.mask_low, decode=True), b.dtype, s.loc)
            ctx.line(_atomic(ctx, b, region_indices(ctx, s.dst, e), value, s.dst.mask_low, s.loc))
        return
    indices = [spell(ctx, i) for i in s.dst.starts]
    text = _atomic(ctx, b, indices, as_type(ctx, s.value, b.dtype, s.loc), s.dst.mask_low, s.loc)
    ctx.line(text if ctx.par is not None else f"if ({TID} == 0) {{ {text} }}")


def _parallel(ctx: Ctx, s: ir.Parallel) -> None:
    if s.per_thread:
        _per_thread(ctx, s)
        return
    matrices = ctx.storage.matrix_loop(s)
    if matrices:
        _matrix_parallel(ctx, s, matrices)
        return
    total = math.prod(s.extents)
    with each_element(ctx, total) as (e, slot):
        ctx.nonneg.update(s.vars)
        rest = 1
        for k, (v, n) in reversed(list(enumerate(zip(s.vars, s.extents)))):
            idx = e if rest == 1 else f"{e} / {rest}"
            idx = f"({idx}) % {n}" if k else idx
            ctx.line(f"const int {ctx.name(v.name)} = {idx};")
            rest *= n
        with ctx.parallel(ParallelFrame(s.vars, s.extents, slot)):
            stmt(ctx, s.body)


def _per_thread(ctx: Ctx, s: ir.Parallel) -> None:
    """Thread ``t`` runs its own iterations: the thread vars are ``t``'s digits (x fastest), the
    vars after them a loop nest in the thread."""
    n = len(ctx.storage.thread_shape)
    ctx.nonneg.update(s.vars)
    with contextlib.ExitStack() as nest:
        nest.enter_context(ctx.block())
        rest = 1
        for k in reversed(range(n)):
            digit = f"int({TID})" if rest == 1 else f"int({TID}) / {rest}"
            ctx.line(f"const int {ctx.name(s.vars[k].name)} = {f'{digit} % {s.extents[k]}' if k else digit};")
            rest *= s.extents[k]
        for v, extent in zip(s.vars[n:], s.extents[n:]):
            name = ctx.name(v.name)
            nest.enter_context(ctx.block(f"for (int {name} = 0; {name} < {extent}; ++{name})"))
        with ctx.parallel(ParallelFrame(s.vars, s.extents, "")):
            stmt(ctx, s.body)


def _matrix_parallel(ctx: Ctx, s: ir.Parallel, matrices: tuple) -> None:
    """A T.Parallel over matrix buffers, per simdgroup tile: each 8x8 tile of every matrix it
    touches is stored to its scratch slot (``matrices``: the plan's (name, element type, slot)),
    each lane runs the body on two elements of it, and the tiles it writes are loaded back."""
    tiling = ctx.storage.tiling(matrices[0][0])
    tn = tiling.tiles_n
    written = {b.name for t in walk(s) for b in buffers_written(t)}
    areas = [(name, _slot(ctx, dtype, k)) for name, dtype, k in matrices]   # (buffer, its slot)
    with _simdgroup_tile(ctx, tiling) as (row, col):
        t = ctx.fresh("t")
        with ctx.block(f"for (int {t} = 0; {t} < {tiling.tiles_m * tn}; ++{t})"):
            for name, area in areas:
                ctx.line(f"simdgroup_store({ctx.name(name)}[{t}], {area}, 8);")
            ctx.line("simdgroup_barrier(mem_flags::mem_threadgroup);")
            q = ctx.fresh("q")
            with ctx.block(f"for (int {q} = int({LANE}); {q} < {SCRATCH}; {q} += {ctx.lanes})"):
                i, j = s.vars
                ctx.nonneg.update(s.vars)
                ctx.line(f"const int {ctx.name(i.name)} = {row} + {t} / {tn} * 8 + {q} / 8;")
                ctx.line(f"const int {ctx.name(j.name)} = {col} + {t} % {tn} * 8 + {q} % 8;")
                staged = tuple((name, f"({area})[{q}]") for name, area in areas)
                with ctx.parallel(ParallelFrame(s.vars, s.extents, "", staged)):
                    stmt(ctx, s.body)
            ctx.line("simdgroup_barrier(mem_flags::mem_threadgroup);")
            for name, area in areas:
                if name in written:
                    ctx.line(f"simdgroup_load({ctx.name(name)}[{t}], {area}, 8);")
            ctx.line("simdgroup_barrier(mem_flags::mem_threadgroup);")


def _for(ctx: Ctx, s: ir.For) -> None:
    var = ctx.name(s.var.name)
    start, stop, step = (spell(ctx, x) for x in (s.start, s.stop, s.step))
    n = ir.as_int(s.step)
    cmp = ">" if n is not None and n < 0 else "<"
    if nonneg(s.start, ctx.nonneg) and (n or 0) > 0:
        ctx.nonneg.add(s.var)
    if s.kind is ir.ForKind.UNROLL:
        ctx.line("#pragma unroll")
    with ctx.block(f"for (int {var} = {start}; {var} {cmp} {stop}; {var} += {step})"):
        stmt(ctx, s.body)


def _if(ctx: Ctx, s: ir.If) -> None:
    with ctx.block(f"if ({spell(ctx, s.cond)})"):
        stmt(ctx, s.then)
    if s.orelse.stmts:
        with ctx.block("else"):
            stmt(ctx, s.orelse)


def _sync(ctx: Ctx, s: ir.BlockSync) -> None:
    flags = "mem_flags::mem_device | mem_flags::mem_threadgroup" if s.device else \
        "mem_flags::mem_threadgroup"
    ctx.line(f"threadgroup_barrier({flags});")


_STMTS: dict[type, Callable[[Ctx, ir.Stmt], None]] = {
    ir.Alloc: _alloc, ir.Copy: _copy, ir.Gemm: _gemm, ir.Fill: _fill, ir.Reduce: _reduce,
    ir.CumSum: _cumsum,
    ir.Store: _store, ir.AtomicAdd: _atomic_add, ir.Parallel: _parallel, ir.For: _for, ir.If: _if,
    ir.BlockSync: _sync}
