"""persist: make a large pipelined kernel persistent — one block per SM looping over tiles.

A block of a short kernel (attention's causal rows, a GEMM's few k blocks) spends a fixed time
starting (barriers, the first loads) and finishing (its result store) with the tensor cores
idle; a block that loops over tiles loads the next tile while it finishes this one.

Requires:  a verified kernel; applies on targets with warp-group MMA whose ``num_sms`` is known.
Ensures:   a kernel with a 2-d or 3-d grid of static extents bound to (bx, by[, bz]), whose body
           is [allocations, prelude, one T.Pipelined loop that plan_pipeline accepts, epilogue],
           with more tiles (the grid's product) than ``target.num_sms`` — and, for a 3-d grid,
           a loop of at most ``MAX_TRIPS_3D`` iterations per tile (an upper bound from its
           constants) — becomes
           ``T.Kernel(num_sms) as block_id`` + one ``T.Persistent`` tile loop (block b runs tiles
           b, b + num_sms, ...) holding the former body with the block indices replaced by the
           tile's coordinates: 2-d, (by, bx) in panels of ``kernel.swizzle_panel`` (default 16)
           rows; 3-d, the launch order (bx fastest, then by, then bz). A note says so. Anything
           else is unchanged.
Preserves: program meaning (each tile's statements run once, in some block) and locations.
"""
from __future__ import annotations

import dataclasses
import math

from .. import ir, schedule
from ..plans import PipelinePlan
from ..target import Target
from ..traverse import transform
from . import plan_pipeline

# Attention (3-d grid: query blocks, heads, batch) on an H100: persistent is 1-12% faster up to
# 32 key blocks per query block, 3-7% slower at 64 (8192 keys): a long loop amortizes its
# block's start and end, and a block's fixed share of causal rows of unequal length leaves SMs
# idle at the end where the hardware's scheduler would not (scripts/tune_attention.py
# --target 'num_sms=0').
MAX_TRIPS_3D = 32


def run(kernel: ir.Kernel, target: Target) -> ir.Kernel:
    sms = target.num_sms
    if not (target.wgmma and sms) or len(kernel.grid) not in (2, 3):
        return kernel
    extents = [ir.as_int(g) for g in kernel.grid]
    if None in extents or math.prod(extents) <= sms:
        return kernel
    if any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in kernel.body.stmts):
        return kernel
    plan = plan_pipeline.run(kernel, target).find_plan(PipelinePlan)
    if plan is None:
        return kernel
    if len(extents) == 3:
        loop = kernel.body.stmts[plan.loop_index]
        most = _most(schedule.trip_count(loop, loop.loc))
        if most is None or most > MAX_TRIPS_3D:
            return kernel.with_note(f"persist: not persistent: the loop at line {loop.loc.line} may run "
                                    f"{'more' if most is None else most} iterations per tile "
                                    f"(persistent 3-d grids: at most {MAX_TRIPS_3D})")
    loc = kernel.loc
    c = lambda v: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    block = ir.Var("block_id", ir.DType.I32, ir.VarKind.BLOCK, loc)
    it = ir.Var("tile_iter", ir.DType.I32, ir.VarKind.LOOP, loc)
    tile = ir.BinOp(ir.BinOpKind.ADD, block, ir.BinOp(ir.BinOpKind.MUL, it, c(sms), ir.DType.I32, loc),
                    ir.DType.I32, loc)
    if len(extents) == 2:
        gx, gy = extents
        group = kernel.swizzle_panel or 16    # measured on H200: 16-row panels beat 8 at 4096^3
        by, bx = schedule.grouped_tile(tile, c(gy), c(gx), group, loc)
        coords, order = (bx, by), f"in panels of {group} rows"
    else:
        coords, order = schedule.launch_order(tile, [c(g) for g in extents], loc), "in launch order"
    place = dict(zip(kernel.block_vars, coords))
    allocs = tuple(s for s in kernel.body.stmts if isinstance(s, ir.Alloc))
    work = tuple(transform(s, lambda n: place.get(n) if isinstance(n, ir.Var) else None)
                 for s in kernel.body.stmts if not isinstance(s, ir.Alloc))
    count = schedule.tiles_of_block(c(math.prod(extents)), block, c(sms), loc)
    tiles = ir.For(it, c(0), count, c(1), ir.ForKind.PERSISTENT, ir.Seq(work, loc), 0, loc)
    out = dataclasses.replace(kernel, grid=(c(sms),), block_vars=(block,), swizzle_panel=0,
                              body=ir.Seq(allocs + (tiles,), kernel.body.loc))
    return out.with_note(f"persist: {math.prod(extents)} tiles > {sms} SMs: one block per SM "
                         f"looping over tiles {order}")


def _most(e: ir.Expr):
    """An upper bound of ``e`` from its constants (None where none is evident): a minimum is at
    most its smallest bounded argument; sums, products and quotients by positive constants of
    bounded terms are bounded."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Call) and e.fn is ir.MathFn.MIN:
        known = [b for b in map(_most, e.args) if b is not None]
        return min(known) if known else None
    if isinstance(e, ir.BinOp):
        a, k = _most(e.a), ir.as_int(e.b)
        if e.op is ir.BinOpKind.ADD:
            b = _most(e.b)
            return None if a is None or b is None else a + b
        if a is not None and k is not None and k > 0:
            if e.op is ir.BinOpKind.FLOORDIV:
                return a // k
            if e.op is ir.BinOpKind.MUL:
                return a * k
            if e.op is ir.BinOpKind.SUB:
                return a - k
    return None
