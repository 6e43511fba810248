"""infer_layouts: choose the layout of every fragment a warp-group MMA writes and of every shared
buffer it or a bulk copy reads.

Requires:  warp_specialize and plan_buffers have run; applies on targets with ``wgmma``.
Ensures:   attr ``layouts`` = ((buffer name, layout), ...): a ``WgmmaAccumulator`` for each gemm
           accumulator, splitting M across the warp groups of its role first (a merged
           ``T.ws(1, 2)`` consumer holds one accumulator, half the rows in each warp group);
           an ``NVMMAShared`` for each shared buffer (of one stage, for rings). A tile no valid
           warp partition fits (docs/ws-semantics.md #3: M a multiple of 64 per warp group, N of 8) is a
           ``CompileError`` at the gemm saying which block sizes work.
Preserves: the program.
"""
from __future__ import annotations

from .. import ir, layouts
from ..plans import LayoutPlan
from ..errors import CompileError
from ..target import Target
from ..traverse import walk


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    if not target.wgmma:
        return kernel
    chosen: dict[str, object] = {}
    for ws in (s for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize)):
        for role in ws.roles:
            warps = 4 * len(role.warpgroups)
            for s in walk(role.body):
                if isinstance(s, ir.Gemm):
                    chosen.setdefault(s.c.buffer.name, _accumulator(s, warps))
    for s in walk(kernel.body):
        if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.SHARED:
            shape = s.buffer.static_shape
            rows = shape[-2] if len(shape) >= 2 else 1
            chosen[s.buffer.name] = layouts.default_shared(rows, shape[-1], s.buffer.dtype.bits)
    return kernel.with_plan(LayoutPlan(tuple(sorted(chosen.items()))))


def _accumulator(g: ir.Gemm, warps: int) -> layouts.WgmmaAccumulator:
    M, N = g.c.tile_shape
    try:
        return layouts.accumulator_for(M, N, warps, g.a.buffer.dtype.bits)
    except ValueError as e:
        raise CompileError(f"T.gemm: {e}", g.loc,
                           [f"this role has {warps // 4} warp group(s): block_M must be a multiple "
                            f"of {16 * warps} (or {64} per warp group) and block_N of 8"]) from None
