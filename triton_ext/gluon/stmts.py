"""Statements inside a role: one small spelling function per Tile IR statement kind.

``seq`` spells a statement list. An arrival on a barrier that TMA copies earlier in the same list
complete on is spelled as that role's ``mbarrier.expect`` of their bytes, issued before the first
of them (the expect is the role's arrival), after a ``gl.thread_barrier`` when the role fenced
stores of its own to shared memory before it (register-staged copies, which it publishes too);
every other arrival is ``mbarrier.arrive``, after a ``gl.thread_barrier`` in a role of several warp
groups (``_barrier_arrive``). Ring slots
``B[(s):+1, ...]`` are ``B.index(s)``; a transposed operand is a ``.permute((1, 0))`` view. A
store to a scalar local assigns the role's Python variable (Gluon carries it through loops and
branches as ``scf.for`` / ``scf.if`` results; legalize made sure it is defined first). A
statement kind without a rule is an ``InternalError``: lowering let it through.
"""
from __future__ import annotations

from typing import Callable

from tilews.lowering import ir
from tilews.lowering.errors import InternalError

from tilews.lowering.layouts import WgmmaOperandA, holds_twice
from tilews.lowering.simplify import fold

from . import fragments, invariants
from .context import GL_DTYPE, Ctx
from .exprs import arg, element_address, mask_arg, nonnegative, spell, write_mask_arg


def seq(ctx: Ctx, s: ir.Seq) -> None:
    """Spell the statement list ``s`` of a role."""
    expects, absorbed = _expects(s)
    for i, t in enumerate(s.stmts):
        if i in expects:
            arrive, nbytes, after_stores = expects[i]
            ctx.origin(arrive.loc)
            if after_stores:        # every thread's fenced stores before the one arriving thread
                ctx.line("gl.thread_barrier()")
            ctx.line(f"mbarrier.expect({_bar(ctx, arrive.barrier)}, {nbytes})")
        if i not in absorbed:
            _stmt(ctx, t)


def _expects(body: ir.Seq) -> tuple[dict[int, tuple[ir.BarrierArrive, int, bool]], set[int]]:
    """Arrivals that are expects: position of the first copy -> (arrival, bytes, whether the
    role fenced stores of its own to shared memory since its last arrival: register-staged
    copies, which the expect then publishes too); the arrivals' positions."""
    pending: dict[ir.BarrierRef, list[ir.Copy]] = {}
    first: dict[ir.BarrierRef, tuple[int, bool]] = {}
    expects, absorbed, fenced = {}, set(), False
    for i, s in enumerate(body.stmts):
        if isinstance(s, ir.ProxyFence):
            fenced = True
        elif isinstance(s, ir.Copy) and s.barrier is not None:
            pending.setdefault(s.barrier, []).append(s)
            first.setdefault(s.barrier, (i, fenced))
        elif isinstance(s, ir.BarrierArrive):
            fenced = False
            if s.barrier in pending:
                copies, (start, stores) = pending.pop(s.barrier), first.pop(s.barrier)
                expects[start] = (s, sum(_nbytes(c.dst) for c in copies), stores)
                absorbed.add(i)
    for copies in pending.values():
        raise InternalError("gluon backend: a copy completes on a barrier that no later arrival in "
                            "its statement list expects", copies[0].loc)
    return expects, absorbed


def _nbytes(r: ir.Region) -> int:
    n = r.buffer.dtype.itemsize
    for e in r.extents:
        n *= e
    return n


def _stmt(ctx: Ctx, s: ir.Stmt) -> None:
    rule = _STMTS.get(type(s))
    if rule is None:
        raise InternalError(f"gluon backend: no rule for {type(s).__name__} inside a role", s.loc)
    ctx.origin(s.loc)
    rule(ctx, s)


def _bar(ctx: Ctx, b: ir.BarrierRef) -> str:
    return f"{ctx.name(b.buffer.name)}.index({arg(ctx, b.index)})"


def _smem(ctx: Ctx, r: ir.Region, loc: ir.Loc) -> str:
    """A shared region as a shared-memory descriptor: leading unit dims (ring slots) indexed,
    then each other dim whole or a constant slice of it."""
    b = r.buffer
    if b.scope is not ir.Scope.SHARED:
        raise InternalError(f"gluon backend: '{b.name}' is not in shared memory", loc)
    text, d = ctx.name(b.name), 0
    while len(r.extents) - d > len(r.tile_shape) and r.extents[d] == 1:
        text += f".index({arg(ctx, r.starts[d])})"
        d += 1
    for view_dim, k in enumerate(range(d, len(r.extents))):
        start, extent = ir.as_int(r.starts[k]), r.extents[k]
        if (start, extent) == (0, b.static_shape[k]):
            continue
        if start is None:
            raise InternalError(f"gluon backend: no rule for a partial region of shared buffer "
                                f"'{b.name}' at a runtime start", loc)
        # a block of rows (split consumers), a slice of columns (one bulk-copy box of a wide tile)
        text += f".slice({start}, {extent})" if view_dim == 0 else f".slice({start}, {extent}, {view_dim})"
    return text


def _fragment(ctx: Ctx, r: ir.Region, loc: ir.Loc) -> str:
    if r.buffer.scope is not ir.Scope.FRAGMENT or not r.is_whole or r.buffer.name not in ctx.fragments:
        raise InternalError(f"gluon backend: no rule for region of {r.buffer.scope.value} buffer "
                            f"'{r.buffer.name}' as a whole fragment of this role", loc)
    return ctx.name(r.buffer.name)


def _tma_load(ctx: Ctx, s: ir.Copy) -> None:
    coords = ", ".join(arg(ctx, x) for x in s.src.starts)
    ctx.line(f"tma.async_copy_global_to_shared({ctx.descriptor(s.src, s.loc)}, [{coords}], "
             f"{_bar(ctx, s.barrier)}, {_smem(ctx, s.dst, s.loc)})")


def _tma_store(ctx: Ctx, s: ir.Copy) -> None:
    _bulk_to_global(ctx, "tma.async_copy_shared_to_global", s.dst, s.src, s.loc)


def _bulk_to_global(ctx: Ctx, fn: str, dst: ir.Region, src: ir.Region, loc: ir.Loc) -> None:
    """A bulk operation of shared tile ``src`` on global tile ``dst`` (its descriptor)."""
    coords = ", ".join(arg(ctx, x) for x in dst.starts)
    ctx.line(f"{fn}({ctx.descriptor(dst, loc)}, [{coords}], {_smem(ctx, src, loc)})")


def _bulk_store_wait(ctx: Ctx, s: ir.BulkStoreWait) -> None:
    ctx.line(f"tma.store_wait({s.outstanding})")


def _store_fragment(ctx: Ctx, s: ir.Copy) -> None:
    value = _fragment(ctx, s.src, s.loc)
    if s.src.buffer.dtype != s.dst.buffer.dtype:
        value += f".to({GL_DTYPE[s.dst.buffer.dtype]})"
    ctx.line(f"{_smem(ctx, s.dst, s.loc)}.store({value})")


def _load_fragment(ctx: Ctx, s: ir.Copy) -> None:
    """shared -> fragment: the run of shared memory loaded in the fragment's layout."""
    value = f"{_smem(ctx, s.src, s.loc)}.load({ctx.layout(s.dst.buffer, s.loc)})"
    if s.src.buffer.dtype != s.dst.buffer.dtype:
        value += f".to({GL_DTYPE[s.dst.buffer.dtype]})"
    ctx.line(f"{ctx.name(s.dst.buffer.name)} = {value}")
    ctx.defined.add(s.dst.buffer.name)


def _load_through_registers(ctx: Ctx, s: ir.Copy) -> None:
    """global -> shared by the role's threads (``AsyncPlan.register_loads``: rows not TMA's):
    chunks of rows, each loaded in the plan's blocked layout (masked when the copy is MASKED:
    zeros past the tensor, as TMA fills) and stored into its rows of the tile."""
    rows_per, layout = ctx.register_loads.get(s.dst.buffer.name, (None, None))
    axes = [d for d, e in enumerate(s.src.extents) if e != 1]
    if rows_per is None or len(axes) != 2 or len(s.dst.tile_shape) != 2:
        raise InternalError(f"gluon backend: no register-load plan for the 2-d copy into "
                            f"'{s.dst.buffer.name}' (the AsyncPlan's register_loads)", s.loc)
    row_dim, rows = axes[0], s.dst.tile_shape[0]
    smem = _smem(ctx, s.dst, s.loc)
    masked = s.mechanism is ir.CopyMechanism.MASKED
    for r0 in range(0, rows, rows_per):
        start = ir.BinOp(ir.BinOpKind.ADD, s.src.starts[row_dim], ir.Const(r0, ir.DType.I32, s.loc),
                         ir.DType.I32, s.loc) if r0 else s.src.starts[row_dim]
        chunk = ir.Region(s.src.buffer, tuple(start if d == row_dim else x for d, x in enumerate(s.src.starts)),
                          tuple(rows_per if d == row_dim else e for d, e in enumerate(s.src.extents)),
                          s.src.loc, s.src.mask_low)
        ptr, mask = fragments.tile_address(ctx, chunk, layout, 2, masked, s.loc)
        value = f"gl.load({ptr}{mask_arg(mask)})"
        if s.src.buffer.dtype != s.dst.buffer.dtype:
            value += f".to({GL_DTYPE[s.dst.buffer.dtype]})"
        rows_of = f".slice({r0}, {rows_per})" if rows_per < rows else ""
        ctx.line(f"{smem}{rows_of}.store({value})")


_COPIES = {(ir.CopyMechanism.TMA, ir.Scope.GLOBAL, ir.Scope.SHARED): _tma_load,
           (ir.CopyMechanism.DIRECT, ir.Scope.GLOBAL, ir.Scope.SHARED): _load_through_registers,
           (ir.CopyMechanism.MASKED, ir.Scope.GLOBAL, ir.Scope.SHARED): _load_through_registers,
           (ir.CopyMechanism.TMA, ir.Scope.SHARED, ir.Scope.GLOBAL): _tma_store,
           (ir.CopyMechanism.DIRECT, ir.Scope.FRAGMENT, ir.Scope.SHARED): _store_fragment,
           (ir.CopyMechanism.DIRECT, ir.Scope.SHARED, ir.Scope.FRAGMENT): _load_fragment,
           (ir.CopyMechanism.DIRECT, ir.Scope.FRAGMENT, ir.Scope.FRAGMENT): fragments.copy,
           (ir.CopyMechanism.DIRECT, ir.Scope.GLOBAL, ir.Scope.FRAGMENT): fragments.load,
           (ir.CopyMechanism.MASKED, ir.Scope.GLOBAL, ir.Scope.FRAGMENT): fragments.load,
           (ir.CopyMechanism.DIRECT, ir.Scope.FRAGMENT, ir.Scope.GLOBAL): fragments.store_tile,
           (ir.CopyMechanism.MASKED, ir.Scope.FRAGMENT, ir.Scope.GLOBAL): fragments.store_tile}


def _copy(ctx: Ctx, s: ir.Copy) -> None:
    key = (s.mechanism, s.src.buffer.scope, s.dst.buffer.scope)
    rule = _COPIES.get(key)
    if rule is None or (key[0] is ir.CopyMechanism.TMA and key[1] is ir.Scope.GLOBAL
                        and s.barrier is None):
        raise InternalError(f"gluon backend: no rule for a {s.mechanism.value} copy "
                            f"{key[1].value} -> {key[2].value}"
                            + (" without a barrier" if rule else ""), s.loc)
    rule(ctx, s)


def _gemm(ctx: Ctx, s: ir.Gemm) -> None:
    if s.instr is not ir.GemmInstr.WGMMA:
        raise InternalError(f"gluon backend: no rule for gemm instruction {s.instr.value}", s.loc)
    b = _smem(ctx, s.b, s.loc) + (".permute((1, 0))" if s.transpose_b else "")
    c = _fragment(ctx, s.c, s.loc)
    if s.a.buffer.scope is ir.Scope.FRAGMENT:          # register A: in the operand layout
        a = _fragment(ctx, s.a, s.loc)
        want = WgmmaOperandA(ctx.layouts[s.c.buffer.name], 32 // s.a.buffer.dtype.bits)
        if ctx.layouts[s.a.buffer.name] != want:
            a = f"gl.convert_layout({a}, {ctx.layout_const(want, 'operand_layout')})"
    else:
        a = _smem(ctx, s.a, s.loc) + (".permute((1, 0))" if s.transpose_a else "")
    if s.clear_accum:
        use = ", use_acc=False"
    elif s.clear_if is not None:
        use = f", use_acc={arg(ctx, fold(ir.UnOp(ir.UnOpKind.NOT, s.clear_if, ir.DType.BOOL, s.loc)))}"
    else:
        use = ""
    if s.a.buffer.dtype is ir.DType.F32 and s.precision is not ir.GemmPrecision.TF32:
        raise InternalError(f"gluon backend: wgmma has no {s.precision.value} float32 form", s.loc)
    # float32 operands: tf32, Triton's default input precision. (Triton 3.6's warpgroup_mma
    # cannot take precision= from a kernel: its constexpr reaches str.lower.)
    ctx.line(f"{c} = warpgroup_mma({a}, {b}, {c}{use}, is_async=True)")
    ctx.defined.add(s.c.buffer.name)


def _gemm_wait(ctx: Ctx, s: ir.GemmWait) -> None:
    """Waits keep the accumulators and register operands that hold a value here alive."""
    accs = [ctx.name(b.name) for b in ctx.accumulators if b.name in ctx.defined]
    if not accs:
        raise InternalError("gluon backend: gemm_wait where no gemm accumulator is defined", s.loc)
    ctx.line(f"{', '.join(accs)} = warpgroup_mma_wait(num_outstanding={s.outstanding}, "
             f"deps=({', '.join(accs)},))")


def _fill(ctx: Ctx, s: ir.Fill) -> None:
    b = s.dst.buffer
    name = _fragment(ctx, s.dst, s.loc)
    ctx.line(f"{name} = gl.full({list(b.static_shape)}, {spell(ctx, s.value)}, {GL_DTYPE[b.dtype]}, "
             f"layout={ctx.layout(b, s.loc)})")
    ctx.defined.add(b.name)


def _store(ctx: Ctx, s: ir.Store) -> None:
    if ctx.par is not None:
        fragments.store(ctx, s)
        return
    ctx.line(f"{ctx.scalar(s.buffer, s.loc)} = {arg(ctx, s.value)}")


def _bulk_reduce_add(ctx: Ctx, s: ir.AtomicAdd) -> None:
    _bulk_to_global(ctx, "async_reduce_add", s.dst, s.value, s.loc)


def _atomic_add(ctx: Ctx, s: ir.AtomicAdd) -> None:
    """The element add at device scope with ``s.order`` as Triton's ``sem``: a pointer (one
    thread adds; Triton broadcasts the old value to the role) or, inside ``T.Parallel``, a
    pointer tensor. A barrier of the role's threads precedes a release and follows an acquire
    (Triton spells ``gl.thread_barrier`` in a partition as a named barrier of its warps)."""
    if isinstance(s.value, ir.Region):
        _bulk_reduce_add(ctx, s)        # legalize_wgmma: a shared tile added by TMA
        return
    b = s.dst.buffer
    if ctx.par is not None and holds_twice(ctx.par.layout, ctx.par.extents):
        raise InternalError(f"gluon backend: the element atomic add into '{b.name}' runs in a "
                            f"T.Parallel of extents {list(ctx.par.extents)} laid out as "
                            f"{ctx.par.layout}, which holds an element twice in a thread: Triton "
                            f"would add it twice", s.loc)
    if s.releases:
        ctx.line("gl.thread_barrier()")
    ptr, inside = element_address(ctx, b, s.dst.starts, s.loc)
    mask = inside + (ctx.par.masks if ctx.par is not None else [])
    value = spell(ctx, s.value)                  # once: spelling may emit temporaries
    if s.value.dtype != b.dtype:
        value = f"gl.cast({value}, {GL_DTYPE[b.dtype]})"
    prev = f"{ctx.scalar(s.prev, s.loc)} = " if s.prev is not None else ""
    ctx.line(f"{prev}gl.atomic_add({ptr}, {value}{write_mask_arg(mask)}, sem='{s.order}', scope='gpu')")
    if s.acquires:
        ctx.line("gl.thread_barrier()")


def _barrier_wait(ctx: Ctx, s: ir.BarrierWait) -> None:
    ctx.line(f"mbarrier.wait({_bar(ctx, s.barrier)}, {arg(ctx, s.parity)})")


def _barrier_arrive(ctx: Ctx, s: ir.BarrierArrive) -> None:
    """One thread arrives. In a role of several warp groups the arrival first waits for all of
    the role's threads: each warp group waits for its own wgmmas, so one group's wait says
    nothing of another's still reading the slot the arrival hands back (Triton places a barrier
    of the role's warps before an arrival only where its shared-memory analysis wants one); so
    does an arrival ``after_role_barrier`` (it hands over what all of the role's threads stored
    to or read from shared memory)."""
    if len(ctx.role) > 1 or s.after_role_barrier:
        ctx.line("gl.thread_barrier()")
    ctx.line(f"mbarrier.arrive({_bar(ctx, s.barrier)}, count=1)")


def _proxy_fence(ctx: Ctx, s: ir.ProxyFence) -> None:
    ctx.line("fence_async_shared()")


_LOOPS = {ir.ForKind.SERIAL: "range", ir.ForKind.PERSISTENT: "range",
          ir.ForKind.UNROLL: "gl.static_range"}


def _for(ctx: Ctx, s: ir.For) -> None:
    if s.kind not in _LOOPS:
        raise InternalError(f"gluon backend: no rule for a {s.kind.value} loop inside a role", s.loc)
    if nonnegative(ctx, s.start) and (ir.as_int(s.step) or 0) > 0:
        ctx.nonneg.add(s.var)
    bounds = ", ".join(arg(ctx, x) for x in (s.start, s.stop, s.step))
    ctx.line(f"for {ctx.name(s.var.name)} in {_LOOPS[s.kind]}({bounds}):")
    outside = set(ctx.defined)                # what the body defines stays in the body
    with ctx.indent(), invariants.named(ctx, s):
        seq(ctx, s.body)
    ctx.defined = outside


def _if(ctx: Ctx, s: ir.If) -> None:
    if ctx.par is not None:
        fragments.masked(ctx, s, seq)
        return
    ctx.line(f"if {arg(ctx, s.cond)}:")
    with ctx.indent():
        seq(ctx, s.then)
    if s.orelse.stmts:
        ctx.line("else:")
        with ctx.indent():
            seq(ctx, s.orelse)


def _parallel(ctx: Ctx, s: ir.Parallel) -> None:
    fragments.parallel(ctx, s, seq)


_STMTS: dict[type, Callable[[Ctx, ir.Stmt], None]] = {
    ir.Parallel: _parallel, ir.Reduce: fragments.reduce,
    ir.Copy: _copy, ir.Gemm: _gemm, ir.GemmWait: _gemm_wait, ir.Fill: _fill,
    ir.BarrierWait: _barrier_wait, ir.BarrierArrive: _barrier_arrive, ir.ProxyFence: _proxy_fence,
    ir.BulkStoreWait: _bulk_store_wait, ir.AtomicAdd: _atomic_add,
    ir.For: _for, ir.If: _if, ir.Store: _store}
