"""persist: make a large pipelined GEMM persistent — one block per SM looping over output tiles.

Requires:  a verified kernel; applies on targets with warp-group MMA whose ``num_sms`` is known.
Ensures:   a kernel with a 2-d grid of static extents (gx, gy) bound to (bx, by), whose body is
           [allocations, prelude, one T.Pipelined loop that plan_pipeline accepts, epilogue], with
           more tiles gx * gy than ``target.num_sms``, becomes ``T.Kernel(num_sms) as block_id`` +
           one ``T.Persistent`` tile loop over (by, bx) in panels of ``kernel.swizzle_panel``
           (default 16) rows, holding the former body with bx, by replaced by the tile's
           coordinates; a note says so. Anything else is unchanged.
Preserves: program meaning (each tile's statements run once, in some block) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir, schedule
from ..plans import PipelinePlan
from ..target import Target
from ..traverse import transform
from . import plan_pipeline


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    sms = target.num_sms
    if not (target.wgmma and sms) or len(kernel.grid) != 2:
        return kernel
    gx, gy = (ir.as_int(g) for g in kernel.grid)
    if gx is None or gy is None or gx * gy <= sms:
        return kernel
    if any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in kernel.body.stmts):
        return kernel
    if plan_pipeline.run(kernel, target).find_plan(PipelinePlan) is None:
        return kernel
    loc = kernel.loc
    c = lambda v: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    block = ir.Var("block_id", ir.DType.I32, ir.VarKind.BLOCK, loc)
    it = ir.Var("tile_iter", ir.DType.I32, ir.VarKind.LOOP, loc)
    group = kernel.swizzle_panel or 16    # measured on H200: 16-row panels beat 8 at 4096^3
    tile = ir.BinOp(ir.BinOpKind.ADD, block, ir.BinOp(ir.BinOpKind.MUL, it, c(sms), ir.DType.I32, loc),
                    ir.DType.I32, loc)
    by, bx = schedule.grouped_tile(tile, c(gy), c(gx), group, loc)
    old_bx, old_by = kernel.block_vars
    place = {old_bx: bx, old_by: by}
    allocs = tuple(s for s in kernel.body.stmts if isinstance(s, ir.Alloc))
    work = tuple(transform(s, lambda n: place.get(n) if isinstance(n, ir.Var) else None)
                 for s in kernel.body.stmts if not isinstance(s, ir.Alloc))
    count = schedule.tiles_of_block(c(gx * gy), block, c(sms), loc)
    tiles = ir.For(it, c(0), count, c(1), ir.ForKind.PERSISTENT, ir.Seq(work, loc), 0, loc)
    out = dataclasses.replace(kernel, grid=(c(sms),), block_vars=(block,), swizzle_panel=0,
                              body=ir.Seq(allocs + (tiles,), kernel.body.loc))
    return out.with_note(f"persist: {gx * gy} tiles > {sms} SMs: one block per SM looping over "
                         f"tiles in panels of {group} rows")
