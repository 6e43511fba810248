"""persist: make a large pipelined kernel persistent — one block per SM looping over tiles.

A block of a short kernel (attention's causal rows, a GEMM's few k blocks) spends a fixed time
starting (barriers, the first loads) and finishing (its result store) with the tensor cores
idle; a block that loops over tiles loads the next tile while it finishes this one.

Requires:  a verified kernel; in the pipelines of backends with warp-group
           MMA (gluon); applies where ``config.caps.num_sms`` is known.
Ensures:   a kernel with a 2-d or 3-d grid of static extents bound to (bx, by[, bz]), whose body
           is [allocations, prelude, one T.Pipelined loop that plan_pipeline accepts, epilogue],
           with more tiles (the grid's product) than ``config.caps.num_sms``, becomes
           ``T.Kernel(num_sms) as block_id`` + one ``T.Persistent`` tile loop holding the former
           body with the block indices replaced by the tile's coordinates: 2-d, (by, bx) in
           panels of ``kernel.swizzle_panel`` (default 16) rows; 3-d, the launch order (bx
           fastest, then by, then bz), the blocks taking rounds of consecutive tiles in
           alternating directions (``schedule.serpentine_tile``: tiles of unequal work — causal
           rows, longest first in each head — then share out evenly; in one direction, with 132
           blocks and 16 rows per head, a block's tiles would all sit at 4 of the 16 row
           positions: H100, causal D64 attention at 2048 keys 0.82x cuDNN in one direction,
           0.95x alternating). A note says so. Unless the persistent form cannot fit shared
           memory: the passes of ``config``'s pipeline between this one and ``plan_buffers`` run
           on it, and where ``plan_buffers`` would place more than ``config.caps.smem_bytes``
           (across tiles a buffer cannot lend its bytes: MLA decode's next query loads while
           this tile's output, on the query's bytes in one tile per block, is stored), the
           kernel keeps its grid and a note says why; so it does where the pipelined loop's
           bounds read global memory (varlen decoding: tiles of unknown work, which a split made
           in advance would deal out unevenly, while the GPU starts each block of a grid on the
           next free SM). Anything else is unchanged.
Preserves: program meaning (each tile's statements run once, in some block) and locations.
"""
from __future__ import annotations

import dataclasses
import math

from .. import ir, schedule
from ..plans import PipelinePlan
from ..simplify import fold
from ..config import BackendConfig
from ..traverse import subexprs, transform, walk
from . import plan_buffers, plan_pipeline


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    sms = config.caps.num_sms
    if not sms or len(kernel.grid) not in (2, 3):
        return kernel
    extents = [ir.as_int(g) for g in kernel.grid]
    if None in extents or math.prod(extents) <= sms:
        return kernel
    if any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in kernel.body.stmts):
        return kernel
    if plan_pipeline.run(kernel, config).find_plan(PipelinePlan) is None:
        return kernel
    sized = _trips_read_from_memory(kernel)
    if sized is not None:
        return kernel.with_note(f"persist: {math.prod(extents)} tiles > {sms} SMs, but the "
                                f"T.Pipelined loop at line {sized.loc.line} runs a number of "
                                f"iterations read from memory: tiles of unknown work would be "
                                f"dealt out unevenly in advance, so one block per tile (the GPU "
                                f"starts each block as an SM frees)")
    loc = kernel.loc
    c = lambda v: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    block = ir.Var("block_id", ir.DType.I32, ir.VarKind.BLOCK, loc)
    it = ir.Var("tile_iter", ir.DType.I32, ir.VarKind.LOOP, loc)
    total = math.prod(extents)
    if len(extents) == 2:
        gx, gy = extents
        group = kernel.swizzle_panel or 16    # measured on H200: 16-row panels beat 8 at 4096^3
        tile = ir.BinOp(ir.BinOpKind.ADD, block, ir.BinOp(ir.BinOpKind.MUL, it, c(sms), ir.DType.I32, loc),
                        ir.DType.I32, loc)
        by, bx = schedule.grouped_tile(tile, c(gy), c(gx), group, loc)
        coords, order = (bx, by), f"in panels of {group} rows"
        count = schedule.tiles_of_block(c(total), block, c(sms), loc)
    else:
        tile = schedule.serpentine_tile(block, it, sms, loc)
        coords = schedule.launch_order(tile, [c(g) for g in extents], loc)
        order = "in launch order, rounds of blocks alternating direction"
        count = fold(schedule.serpentine_tiles_of_block(total, block, sms, loc))
    place = dict(zip(kernel.block_vars, coords))
    allocs = tuple(s for s in kernel.body.stmts if isinstance(s, ir.Alloc))
    work = tuple(transform(s, lambda n: place.get(n) if isinstance(n, ir.Var) else None)
                 for s in kernel.body.stmts if not isinstance(s, ir.Alloc))
    tiles = ir.For(it, c(0), count, c(1), ir.ForKind.PERSISTENT, ir.Seq(work, loc), 0, loc)
    out = dataclasses.replace(kernel, grid=(c(sms),), block_vars=(block,), swizzle_panel=0,
                              body=ir.Seq(allocs + (tiles,), kernel.body.loc))
    need = plan_buffers.peak_after("persist", out, config)
    if need > config.caps.smem_bytes:
        return kernel.with_note(f"persist: {total} tiles > {sms} SMs, but the persistent kernel "
                                f"would need {need} bytes of shared memory (no buffer lends its "
                                f"bytes across tiles), more than the {config.caps.smem_bytes} of "
                                f"target '{config.name}': one block per tile")
    return out.with_note(f"persist: {total} tiles > {sms} SMs: one block per SM "
                         f"looping over tiles {order}")


def _trips_read_from_memory(kernel: ir.Kernel):
    """The pipelined loop, where its bounds read global memory (varlen decoding's
    ``cu_seqlens[b + 1] - cu_seqlens[b]`` keys); else None."""
    for s in walk(kernel.body):
        if isinstance(s, ir.For) and s.kind is ir.ForKind.PIPELINED:
            if any(isinstance(e, ir.Load) and e.buffer.scope is ir.Scope.GLOBAL
                   for bound in (s.start, s.stop) for e in subexprs(bound)):
                return s
    return None
