"""A stable, deterministic text form of the Tile IR (for golden tests, dumps and reports).

Total over ``ir.NODE_CLASSES``; names come from the IR itself, never from ``id()``.
"""
from __future__ import annotations

from typing import Union

from . import ir


def expr(e: ir.Expr) -> str:
    if isinstance(e, ir.Const):
        if e.dtype in (ir.DType.I32, ir.DType.BOOL):
            return repr(e.value)
        return f"{e.value!r}:{e.dtype.value}"
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.BinOp):
        return f"({expr(e.a)} {e.op.value} {expr(e.b)})"
    if isinstance(e, ir.Cmp):
        return f"({expr(e.a)} {e.op.value} {expr(e.b)})"
    if isinstance(e, ir.UnOp):
        sep = " " if e.op is ir.UnOpKind.NOT else ""
        return f"({e.op.value}{sep}{expr(e.a)})"
    if isinstance(e, ir.Call):
        return f"{e.fn.value}({', '.join(expr(a) for a in e.args)})"
    if isinstance(e, ir.Cast):
        return f"cast<{e.dtype.value}>({expr(e.value)})"
    if isinstance(e, ir.Bitcast):
        return f"bitcast<{e.dtype.value}>({expr(e.value)})"
    if isinstance(e, ir.Select):
        return f"select({expr(e.cond)}, {expr(e.a)}, {expr(e.b)})"
    if isinstance(e, ir.Load):
        return f"{e.buffer.name}[{', '.join(expr(i) for i in e.indices)}]{mask_low(e.mask_low)}"
    raise TypeError(f"printer: no rule for expression {type(e).__name__}")


def buffer_decl(b: ir.Buffer) -> str:
    dims = ", ".join(expr(d) for d in b.shape)
    s = f"{b.name}: {b.scope.value} {b.dtype.value}[{dims}]"
    if b.arrive_counts:
        s += f" arrive_counts={list(b.arrive_counts)}"
    return s


def region(r: ir.Region) -> str:
    parts = [f"{expr(s)}:+{e}" for s, e in zip(r.starts, r.extents)]
    return f"{r.buffer.name}[{', '.join(parts)}]{mask_low(r.mask_low)}"


def mask_low(flags: tuple[bool, ...]) -> str:
    """``{mask_low 0,2}``: the dims whose index an access checks for ``>= 0`` (none: empty)."""
    dims = ",".join(str(d) for d, f in enumerate(flags) if f)
    return f"{{mask_low {dims}}}" if dims else ""


def barrier(b: ir.BarrierRef) -> str:
    return f"{b.buffer.name}[{expr(b.index)}]"


def _stmt_line(s: ir.Stmt) -> str:
    if isinstance(s, ir.Alloc):
        return f"alloc {buffer_decl(s.buffer)}"
    if isinstance(s, ir.PointerView):
        strides = ", ".join(expr(x) for x in s.strides)
        return f"view {buffer_decl(s.buffer)} at {expr(s.address)} strides=({strides})"
    if isinstance(s, ir.Copy):
        line = f"copy {region(s.src)} -> {region(s.dst)}"
        if s.barrier is not None:
            line += f" on {barrier(s.barrier)}"
        if s.mechanism is not ir.CopyMechanism.UNDECIDED:
            line += f" [{s.mechanism.value}]"
        return line
    if isinstance(s, ir.Gemm):
        flags = [n for n, v in (("transpose_a", s.transpose_a), ("transpose_b", s.transpose_b),
                               ("clear_accum", s.clear_accum)) if v]
        if s.clear_if is not None:
            flags.append(f"clear_if={expr(s.clear_if)}")
        if s.instr is not ir.GemmInstr.UNDECIDED:
            flags.append(f"instr={s.instr.value}")
        if s.precision is not ir.GemmPrecision.TF32:
            flags.append(f"precision={s.precision.value}")
        tail = f" [{', '.join(flags)}]" if flags else ""
        return f"gemm {region(s.a)}, {region(s.b)} -> {region(s.c)}{tail}"
    if isinstance(s, ir.Fill):
        return f"fill {region(s.dst)} = {expr(s.value)}"
    if isinstance(s, ir.Reduce):
        clear = "" if s.clear else " accumulate"
        return f"reduce_{s.kind.value} {s.src.name} -> {s.dst.name} dim={s.dim}{clear}"
    if isinstance(s, ir.CumSum):
        reverse = " reverse" if s.reverse else ""
        return f"cumsum {s.src.name} -> {s.dst.name} dim={s.dim}{reverse}"
    if isinstance(s, ir.Store):
        return (f"{s.buffer.name}[{', '.join(expr(i) for i in s.indices)}]{mask_low(s.mask_low)} = "
                f"{expr(s.value)}")
    if isinstance(s, ir.AtomicAdd):
        v = region(s.value) if isinstance(s.value, ir.Region) else expr(s.value)
        prev = f"{s.prev.name} = " if s.prev is not None else ""
        order = f" {s.order}" if s.order != "relaxed" else ""
        return f"{prev}atomic_add{order} {region(s.dst)} += {v}"
    if isinstance(s, ir.GemmWait):
        return f"gemm_wait outstanding={s.outstanding}"
    if isinstance(s, ir.ProxyFence):
        return "proxy_fence"
    if isinstance(s, ir.BlockSync):
        return "block_sync device" if s.device else "block_sync"
    if isinstance(s, ir.BulkStoreWait):
        return f"bulk_store_wait outstanding={s.outstanding}"
    if isinstance(s, ir.BarrierArrive):
        return f"barrier_arrive {barrier(s.barrier)}" + (" after_role_barrier" if s.after_role_barrier else "")
    if isinstance(s, ir.BarrierWait):
        return f"barrier_wait {barrier(s.barrier)} parity={expr(s.parity)}"
    raise TypeError(f"printer: no rule for statement {type(s).__name__}")


def _stmt(s: ir.Stmt, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    if isinstance(s, ir.Seq):
        for t in s.stmts:
            _stmt(t, indent, out)
        if not s.stmts:
            out.append(pad + "pass")
        return
    if isinstance(s, ir.For):
        stages = f" stages={s.num_stages}" if s.kind is ir.ForKind.PIPELINED else ""
        out.append(f"{pad}for {s.var.name} in {s.kind.value}({expr(s.start)}, {expr(s.stop)}, "
                   f"{expr(s.step)}){stages}:")
        _stmt(s.body, indent + 1, out)
    elif isinstance(s, ir.Parallel):
        pairs = ", ".join(f"{v.name} < {e}" for v, e in zip(s.vars, s.extents))
        out.append(f"{pad}{'per_thread' if s.per_thread else 'parallel'} {pairs}:")
        _stmt(s.body, indent + 1, out)
    elif isinstance(s, ir.If):
        out.append(f"{pad}if {expr(s.cond)}:")
        _stmt(s.then, indent + 1, out)
        if s.orelse.stmts:
            out.append(f"{pad}else:")
            _stmt(s.orelse, indent + 1, out)
    elif isinstance(s, ir.Role):
        budget = f" warps={s.num_warps} regs={s.num_regs}" if s.num_warps else ""
        out.append(f"{pad}ws{tuple(s.warpgroups)}{budget}:".replace(",)", ")"))
        _stmt(s.body, indent + 1, out)
    elif isinstance(s, ir.WarpSpecialize):
        out.append(f"{pad}warp_specialize:")
        for r in s.roles:
            _stmt(r, indent + 1, out)
    else:
        out.append(pad + _stmt_line(s))


def kernel(k: ir.Kernel) -> str:
    params = ", ".join(buffer_decl(p) if isinstance(p, ir.Buffer) else f"{p.name}: param {p.dtype.value}"
                       for p in k.params)
    grid = ", ".join(expr(g) for g in k.grid)
    blocks = ", ".join(v.name for v in k.block_vars)
    head = f"kernel {k.name}({params}) grid=({grid}) threads={k.threads}"
    if k.swizzle_panel:
        head += f" swizzle={k.swizzle_panel}"
    if k.fp8_promote_every:
        head += f" fp8_promote_every={k.fp8_promote_every}"
    if k.scratch:
        head += f" scratch=({', '.join(b.name for b in k.scratch)})"
    out = [head + ":", f"  blocks {blocks}"]
    out += [f"  let {v.name} = {expr(e)}" for v, e in k.block_defs]
    for plan in k.plans:
        out.append(f"  plan {plan!r}")
    for note in k.notes:
        out.append(f"  note {note}")
    _stmt(k.body, 1, out)
    return "\n".join(out) + "\n"


def to_text(node: Union[ir.Kernel, ir.Stmt, ir.Expr]) -> str:
    if isinstance(node, ir.Kernel):
        return kernel(node)
    if isinstance(node, ir.Expr):
        return expr(node)
    out: list[str] = []
    _stmt(node, 0, out)
    return "\n".join(out) + "\n"
