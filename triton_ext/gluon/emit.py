"""The Gluon emitter: a kernel lowered for Hopper (with an ``AsyncPlan``) -> the source of
one Python module.

The module holds, in order:

* the layouts ``infer_layouts`` chose, one ``gl.constexpr`` per distinct layout (named after the
  first buffer that has it: ``<buffer>_layout``), then those derived from them that a use needs;
* one ``@gluon.jit`` function per role (``<kernel>_ws<warp groups>``), taking the TMA
  descriptors, the scalar parameters, the shared buffers and the barriers, then the pointer and
  strides of each global buffer the role reads element by element (the plan's ``pointer_params``);
  each begins with the grid dependency (``_grid_dependency``); block indices are read with
  ``gl.program_id`` inside each;
* the kernel ``<kernel>``: per global buffer its descriptors, then its pointer and strides if it
  is a pointer parameter; shared buffers (those the ``SharedMemoryPlan`` lets share bytes as
  views of one arena per group, at their planned offsets) and mbarriers (initialized with the counts legalize
  translated to Gluon arrivals, slot by slot across the arrays: ``_init_barriers``), one
  ``gl.warp_specialize`` (the default role first, then the workers with their warps and
  registers); the barriers are not invalidated at the end (nothing reuses their bytes);
* host functions: ``<kernel>_args(<params>)`` builds the kernel's arguments from the tensors (one
  ``TensorDescriptor`` per (buffer, block shape), laid out like the shared buffer it fills or
  drains; the tensor and its strides for a pointer parameter) and ``<kernel>_grid(<scalar
  params>)`` gives the launch grid.

The emitter spells what lowering decided (``Copy.mechanism``, ``Gemm.instr``, ``GemmWait``,
``Role.num_warps``/``num_regs``, the ``AsyncPlan``'s ``num_warps``, ``default_role``,
``barrier_counts``, ``tma_descriptors``, ``scalar_locals``, ``pointer_params`` and the
``LayoutPlan``) and
decides nothing itself; the statements inside roles are spelled by ``stmts`` (fragment math by
``fragments``, which also decides where a fragment's Python variable is first defined); a scalar
local is a Python variable of its role (no allocation). Layouts are module-level constants,
each declared once (``ctx.layout_const``). Anything without a rule is an
``InternalError``: lowering let it through. Every statement is preceded by a
``# tilews: file.py:LINE`` comment.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from tilews.lowering import ir
from tilews.lowering.errors import InternalError
from tilews.lowering.roles import describe
from tilews.lowering.traverse import bulk_reduce, bulk_tiles, walk

from ..pysource import GRID_SUFFIX, host_expr
from .context import GL_DTYPE, Ctx
from .exprs import spell
from .fragments import declare_fragments
from .stmts import seq

ARGS_SUFFIX = "_args"
BOUND_ARGS_SUFFIX = "_bound_args"     # the arguments expanded for Triton's C launcher (launch.py)
SITES_SUFFIX = "_descriptor_sites"    # each TMA descriptor's (block, layout), in argument order
BOUND_SITES = "_sites"                # that function's parameter of per-site expanders
# buffers the SharedMemoryPlan lets share bytes are views of one arena allocation per group
# (Triton's allocator cannot reuse allocations live across gl.warp_specialize): rows of 128 bytes
# in the 128-byte swizzle, so the arena is aligned as swizzled tiles need (1024 bytes), viewed
# flat to slice each buffer at its planned offset
ARENA_ROW_BYTES = 128
ARENA_LAYOUT = "gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)"
ARENA_VIEW_LAYOUT = "gl.SwizzledSharedLayout(1, 1, 1, order=[0])"
# the host function making each TMA descriptor: Gluon's TensorDescriptor.from_tensor, which a
# launcher may replace on the loaded module with a cached one (triton_ext.gluon.descriptors)
DESCRIPTOR_FN = "_tilews_descriptor"
_IMPORTS = ["from triton.experimental import gluon",
            "from triton.experimental.gluon import language as gl",
            "from triton.experimental.gluon.language.nvidia.hopper import (",
            "    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)",
            "from triton.experimental.gluon.nvidia.hopper import TensorDescriptor",
            "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait", "",
            f"{DESCRIPTOR_FN} = TensorDescriptor.from_tensor"]
# where a kernel adds a shared tile into global memory (bulk_reduce.py: Gluon has no such function)
_BULK_REDUCE_IMPORT = "from tilews.triton_ext.gluon.bulk_reduce import async_reduce_add"


def emit(kernel: ir.Kernel, fast_math: bool = False) -> str:
    """The module source of a kernel lowered for the Gluon backend. ``fast_math``: fp32 division
    and square root in Triton's approximate forms (``SourceWriter.ieee_rounded``)."""
    ctx = Ctx(kernel, fast_math)   # an InternalError if lowering made no AsyncPlan
    if ctx.fn != kernel.name:
        raise InternalError(f"gluon backend: kernel name '{kernel.name}' is a name its generated "
                            f"source needs", kernel.loc)
    wss = [s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize)]
    if len(wss) != 1:
        raise InternalError("gluon backend: the kernel body needs exactly one top-level "
                            "WarpSpecialize", kernel.loc)
    for name, layout in ctx.layouts.items():     # in the plan's order; derived ones on first use
        ctx.layout_const(layout, f"{name}_layout")
    roles = _ordered_roles(ctx, wss[0])
    fns = {r.warpgroups: ctx.fresh(f"{kernel.name}_ws" + "_".join(map(str, r.warpgroups)))
           for r in roles}
    shared = [s.buffer for s in kernel.body.stmts if isinstance(s, ir.Alloc)
              and s.buffer.scope in (ir.Scope.SHARED, ir.Scope.BARRIER)]
    common = [*ctx.descriptors.values(), *(ctx.name(v.name) for v in kernel.scalar_params),
              *(ctx.name(b.name) for b in shared)]
    params = {r.warpgroups: common + [x for b in kernel.buffer_params
                                      if r.warpgroups in ctx.pointers.get(b.name, ())
                                      for x in _pointer(ctx, b)]
              for r in roles}
    for r in roles:
        _role(ctx, r, fns[r.warpgroups], params[r.warpgroups])
    _kernel_fn(ctx, kernel, roles, fns, params)
    _host_fns(ctx, kernel)
    origin = os.path.basename(kernel.loc.file)
    imports = _IMPORTS + ([_BULK_REDUCE_IMPORT] if any(map(bulk_reduce, walk(kernel.body))) else [])
    head = [f'"""Generated by tilews from kernel `{kernel.name}` ({origin}) for Hopper (Gluon); do '
            f'not edit."""', *imports, ""]
    return "\n".join(head + ctx.layout_lines + ctx.lines) + "\n"


# ----------------------------------------------------------------------------------------------
# module parts


def _ordered_roles(ctx: Ctx, ws: ir.WarpSpecialize) -> list[ir.Role]:
    """The default role first (it runs on the kernel's ``num_warps``), then the workers."""
    default = [r for r in ws.roles if r.warpgroups == ctx.default_role]
    if len(default) != 1:
        raise InternalError(f"gluon backend: the AsyncPlan's default_role {ctx.default_role} names no role",
                            ws.loc)
    if default[0].num_warps != ctx.plan.num_warps:
        raise InternalError(f"gluon backend: the default role has {default[0].num_warps} warps but "
                            f"the AsyncPlan's num_warps is {ctx.plan.num_warps}", ws.loc)
    for r in ws.roles:
        if r.num_warps <= 0 or (r is not default[0] and r.num_regs <= 0):
            raise InternalError(f"gluon backend: {describe(r.warpgroups)} has no warp/register budget",
                                r.loc)
    return default + [r for r in ws.roles if r is not default[0]]


def _pointer(ctx: Ctx, b: ir.Buffer) -> list[str]:
    """A global buffer passed as a pointer: its name, then its strides."""
    return [ctx.name(b.name)] + [ctx.stride(b, d) for d in range(len(b.shape))]


def _role(ctx: Ctx, role: ir.Role, fn: str, params: list[str]) -> None:
    _jit_def(ctx, role.loc, fn, params)
    ctx.role = role.warpgroups
    with ctx.indent():
        ctx.line(f'"""{describe(role.warpgroups)}: {role.num_warps} warp(s), {role.num_regs} '
                 f'registers per thread."""')
        _grid_dependency(ctx, role)
        _blocks(ctx, ctx.kernel)
        declare_fragments(ctx, role)
        seq(ctx, role.body)


def _grid_dependency(ctx: Ctx, role: ir.Role) -> None:
    """Programmatic dependent launch (every kernel is launched with it: ``compile.OPTIONS``): the
    kernel may start while the previous kernel in the stream still runs, so each role first waits
    (``griddepcontrol.wait``: until the previous grid has completed and its memory operations are
    visible to this grid; a no-op when the kernel was launched without PDL) before it touches
    global memory in any way: it may read what the previous kernel writes, and write what it
    reads. Each role waits itself, as its first statement: a worker partition starts on its own
    path through the compiled function, which the kernel function's prologue does not dominate,
    and it overlaps the previous kernel from its own start. Everything before the wait (barrier
    inits, the roles' set-up) touches no global memory.

    The default role then lets the next kernel launch (``griddepcontrol.launch_dependents``; the
    first call in a block counts for the block): its blocks may be scheduled once every block of
    this grid has called it or exited, and only wait there for this grid to complete. A block
    calls it only once resident and past its own wait, so the next grid's blocks take only
    resources our blocks leave free once all of ours are resident (the last wave of a multi-wave
    grid; every block of a persistent one): none of ours can be kept from a slot, and ours never
    wait on the next grid, so ours complete and the next grid's wait returns: no deadlock, no
    starvation. Triggered after the wait, never before, at most two grids are in flight. Were
    it never called, the trigger would fire as our blocks exit (the next kernel then starts only
    as early as its launch gap allows)."""
    ctx.line("gdc_wait()")
    if role.warpgroups == ctx.default_role:
        ctx.line("gdc_launch_dependents()")


def _jit_def(ctx: Ctx, loc: ir.Loc, name: str, params: list[str]) -> None:
    ctx.lines += ["", ""]
    ctx.origin(loc)
    ctx.line("@gluon.jit")
    ctx.line(f"def {name}({', '.join(params)}):")


def _kernel_fn(ctx: Ctx, kernel: ir.Kernel, roles, fns, params) -> None:
    _jit_def(ctx, kernel.loc, ctx.fn, [n for names, _, _ in _kernel_params(ctx, kernel) for n in names])
    barriers = [s.buffer for s in kernel.body.stmts
                if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER]
    with ctx.indent():
        for s in kernel.body.stmts:
            rule = _TOP.get(type(s))
            if rule is None:
                raise InternalError(f"gluon backend: no rule for top-level {type(s).__name__}",
                                    s.loc)
            if not isinstance(s, ir.Alloc) and barriers:
                _init_barriers(ctx, barriers)
                barriers = []
            rule(ctx, s, roles, fns, params)


def _init_barriers(ctx: Ctx, barriers: list) -> None:
    """Every mbarrier of the kernel initialized, slot i of each array in turn (Triton's membar
    puts a block barrier between two inits of one array, none between inits of two arrays: 52 ->
    42 of them in a 12-stage FP8 kernel), then one block barrier, so the inits are no pending
    writes where the roles' loops begin (else membar puts a barrier inside a loop that waits on
    them first). They are not invalidated at the kernel's end: nothing reuses their bytes
    (another 23 block barriers)."""
    for i in range(max(len(ctx.counts[b.name]) for b in barriers)):
        for b in barriers:
            counts = ctx.counts[b.name]
            if i < len(counts):
                ctx.line(f"mbarrier.init({ctx.name(b.name)}.index({i}), count={counts[i]})")
    ctx.line("gl.thread_barrier()")


def _kernel_params(ctx: Ctx, kernel: ir.Kernel) -> list[tuple[list[str], str, Optional[tuple]]]:
    """The kernel's parameters in order, in groups with each group's host expression and, for a
    TMA descriptor, its site (the tensor's name, the block, the layout's name): per global buffer
    its TMA descriptors (one each), then its pointer and strides (one group: ``B,
    *B.stride()``, one stride query per buffer) if roles read it element by element; each scalar
    parameter as itself."""
    targets = _descriptor_buffers(ctx)
    out = []
    for p in kernel.params:
        name = ctx.name(p.name)
        if isinstance(p, ir.Var):
            out.append(([name], name, None))
            continue
        for (g, block), desc in ctx.descriptors.items():
            if g == p.name:
                layout = ctx.layout(targets[(g, block)], kernel.loc)
                out.append(([desc], f"{DESCRIPTOR_FN}({name}, {list(block)}, {layout}.value)",
                            (name, list(block), layout)))
        if p.name in ctx.pointers:
            out.append((_pointer(ctx, p), f"{name}, *{name}.stride()", None))
    return out


def _host_fns(ctx: Ctx, kernel: ir.Kernel) -> None:
    """The host functions beside the kernel: its arguments (``<kernel>_args``), the same expanded
    for Triton's C launcher by a call signature's descriptor sites (``<kernel>_bound_args``, with
    ``<kernel>_descriptor_sites``: each site's block and layout, in order), and its grid."""
    names = [ctx.name(p.name) for p in kernel.params]
    groups = _kernel_params(ctx, kernel)
    args = [host for _, host, _ in groups]
    sites = [site for _, _, site in groups if site is not None]
    sites_param = ctx.fresh(BOUND_SITES)
    expanded, i = [], 0
    for _, host, site in groups:
        if site is None:
            expanded.append(host)
        else:
            expanded.append(f"*{sites_param}[{i}]({site[0]})")
            i += 1
    scalars = ", ".join(ctx.name(v.name) for v in kernel.scalar_params)
    grid = ", ".join(host_expr(ctx, g) for g in kernel.grid) + ("," if len(kernel.grid) == 1 else "")
    ctx.lines += ["", "", f"def {ctx.fresh(kernel.name + ARGS_SUFFIX)}({', '.join(names)}):",
                  '    """The kernel\'s arguments: TMA descriptors laid out like the shared buffers '
                  'they fill or drain, tensors and strides for pointers."""',
                  "    return (" + ",\n            ".join(args) + ("," if len(args) == 1 else "") + ")",
                  "", "", f"def {ctx.fresh(kernel.name + BOUND_ARGS_SUFFIX)}({', '.join([sites_param, *names])}):",
                  '    """The kernel\'s arguments as Triton\'s C launcher takes them, for calls of one '
                  f'signature: each TMA descriptor expanded by its site ({sites_param}[i](tensor): '
                  'its encoded tensor map, shape and strides)."""',
                  "    return (" + ",\n            ".join(expanded) + ("," if len(expanded) == 1 else "") + ")",
                  "", "", f"{ctx.fresh(kernel.name + SITES_SUFFIX)} = (" +
                  "".join(f"({block}, {layout}.value), " for _, block, layout in sites) + ")",
                  "", "", f"def {ctx.fresh(kernel.name + GRID_SUFFIX)}({scalars}):",
                  f"    return ({grid})"]


def _descriptor_buffers(ctx: Ctx) -> dict:
    """(global buffer, block) -> the shared buffer its TMA copies (and bulk reduce-adds) fill or
    drain."""
    out: dict = {}
    for s in walk(ctx.kernel.body):
        tiles = bulk_tiles(s)
        if tiles is not None:
            g, smem = tiles
            key = (g.buffer.name, tuple(g.extents))
            seen = out.setdefault(key, smem.buffer)
            if ctx.layouts.get(seen.name) != ctx.layouts.get(smem.buffer.name):
                raise InternalError(f"gluon backend: descriptor {key} serves shared buffers of "
                                    f"different layouts", s.loc)
    for key in ctx.descriptors:
        if key not in out:
            raise InternalError(f"gluon backend: no TMA copy uses descriptor {key}", ctx.kernel.loc)
    return out


def _blocks(ctx: Ctx, kernel: ir.Kernel) -> None:
    for d, v in enumerate(kernel.block_vars):
        ctx.line(f"{ctx.name(v.name)} = gl.program_id({d})")
    for v, e in kernel.block_defs:
        ctx.line(f"{ctx.name(v.name)} = {spell(ctx, e)}")


# ----------------------------------------------------------------------------------------------
# top level of the kernel function


def _alloc(ctx: Ctx, s: ir.Alloc, *_) -> None:
    b = s.buffer
    name = ctx.name(b.name)
    if b.scope is ir.Scope.FRAGMENT:
        ctx.line(f"# {name}: fragment {b.dtype.value}{list(b.static_shape)}, held by its role")
        return
    if b.scope is ir.Scope.LOCAL:
        ctx.line(f"# {ctx.scalar(b, s.loc)}: scalar {b.dtype.value}, a value of its role")
        return
    ctx.origin(s.loc)
    if b.scope is ir.Scope.SHARED and b.name in ctx.arenas:
        arena, offset, span = ctx.arenas[b.name]
        if arena not in ctx.spelled_arenas:
            ctx.spelled_arenas.add(arena)
            rows = -(-span // 1024) * (1024 // ARENA_ROW_BYTES)
            ctx.line(f"{arena} = gl.allocate_shared_memory(gl.int8, [{rows}, {ARENA_ROW_BYTES}], "
                     f"{ARENA_LAYOUT})._reinterpret(gl.int8, [{rows * ARENA_ROW_BYTES}], "
                     f"{ARENA_VIEW_LAYOUT})")
        ctx.line(f"{name} = {arena}.slice({offset}, {b.nbytes})._reinterpret("
                 f"{GL_DTYPE[b.dtype]}, {list(b.static_shape)}, {ctx.layout(b, s.loc)})")
    elif b.scope is ir.Scope.SHARED:
        ctx.line(f"{name} = gl.allocate_shared_memory({GL_DTYPE[b.dtype]}, {list(b.static_shape)}, "
                 f"{ctx.layout(b, s.loc)})")
    elif b.scope is ir.Scope.BARRIER:
        counts = ctx.counts.get(b.name)
        if counts is None or len(counts) != len(b.arrive_counts):
            raise InternalError(f"gluon backend: the AsyncPlan's barrier_counts have no counts for barrier "
                                f"'{b.name}'", s.loc)
        ctx.line(f"{name} = gl.allocate_shared_memory(gl.int64, [{len(counts)}, 1], "
                 f"mbarrier.MBarrierLayout())")     # initialized by _init_barriers
    else:
        raise InternalError(f"gluon backend: no rule for {b.scope.value} allocations", s.loc)


def _warp_specialize(ctx: Ctx, s: ir.WarpSpecialize, roles, fns, params) -> None:
    ctx.origin(s.loc)
    tuples = {}          # one argument tuple per distinct parameter list
    for r in roles:
        key = tuple(params[r.warpgroups])
        if key not in tuples:
            tuples[key] = "args" if not tuples else ctx.fresh(f"{fns[r.warpgroups]}_args")
            ctx.line(f"{tuples[key]} = ({', '.join(key)}{',' if len(key) == 1 else ''})")
    parts = ", ".join(f"({fns[r.warpgroups]}, {tuples[tuple(params[r.warpgroups])]})" for r in roles)
    warps = [r.num_warps for r in roles[1:]]
    regs = [r.num_regs for r in roles[1:]]
    ctx.line(f"gl.warp_specialize([{parts}], {warps}, {regs})")


_TOP: dict[type, Callable] = {ir.Alloc: _alloc, ir.WarpSpecialize: _warp_specialize}
