"""persist: make a large pipelined kernel persistent — one block per SM looping over tiles.

A block of a short kernel (attention's causal rows, a GEMM's few k blocks) spends a fixed time
starting (barriers, the first loads) and finishing (its result store) with the tensor cores
idle; a block that loops over tiles loads the next tile while it finishes this one.

Requires:  a verified kernel; in the pipelines of backends with warp-group
           MMA (gluon); applies where ``config.caps.num_sms`` is known.
Ensures:   a kernel with a 2-d or 3-d grid of static extents — or a 3-d grid sized at launch
           whose pipelined loop's bounds read global memory (varlen attention's
           ``ceil(max_seqlen_q / block_M)`` x heads x batch; other grids sized at launch, such as
           ``tilews.ops.matmul``'s split-K over a runtime M, keep their grid with a note: their
           persistent form is unmeasured) — bound to (bx,
           by[, bz]), whose body is [allocations, prelude, one T.Pipelined loop that plan_pipeline
           accepts, epilogue], with more tiles (the grid's product) than ``config.caps.num_sms`` (a
           grid sized at launch is taken to have more: where it has fewer, the blocks without a
           tile exit), becomes ``T.Kernel(num_sms) as block_id`` + one ``T.Persistent`` tile loop
           holding the former body with the block indices replaced by the tile's coordinates: 2-d,
           (by, bx) in panels of ``kernel.swizzle_panel`` (default 16) rows; 3-d, the launch order
           (bx fastest, then by, then bz), the blocks taking rounds of consecutive tiles in
           alternating directions (``schedule.serpentine_tile``: tiles of unequal work — causal
           rows, longest first in each head — then share out evenly; in one direction, with 132
           blocks and 16 rows per head, a block's tiles would all sit at 4 of the 16 row positions:
           H100, causal D64 attention at 2048 keys 0.82x cuDNN in one direction, 0.95x
           alternating). The extents of a grid sized at launch are clamped at 0 (a launch with one
           below 1 runs no block; the tile count is then 0) and each block's count of tiles is
           computed at run time. A note says so. Unless the persistent form cannot fit shared
           memory: the passes of ``config``'s pipeline between this one and ``plan_buffers`` run on
           it, and where ``plan_buffers`` would place more than ``config.caps.smem_bytes`` (across
           tiles a buffer cannot lend its bytes: MLA decode's next query loads while this tile's
           output, on the query's bytes in one tile per block, is stored), the kernel keeps its
           grid and a note says why.
           Where the pipelined loop's bounds read global memory (tiles whose work is known only at
           run time), the deal made in advance is still even when every block's tiles sample that
           work alike: so it is made where every such read is indexed by no block index but a 3-d
           grid's last (bz). Then the work read from memory is per slab of tiles (one sequence: its
           ``ceil(max_seqlen_q / block_M)`` x heads tiles, consecutive in launch order: at 16 heads
           a whole round of 132 tiles once ``max_seqlen_q`` exceeds 1024), each slab is spread over
           the round's positions like a dense kernel's heads, and within a slab the work varies
           with bx as the dense causal rows do, which the alternating rounds even out; a tile past
           its sequence's end does no loop iteration (a few scalar loads, its prelude, an epilogue
           the program may skip), like a dense tile of few keys. A deal made at run time (an atomic
           tile counter) would need the producer and consumer roles to agree on each tile through
           shared memory and a barrier; it is not needed here. Where a read is indexed by another
           block index (varlen decoding's ``cu_seqlens[b]`` on a (batch, head group) grid: a tile
           is a whole sequence, a few tiles per sequence), a static deal would hand one block
           several long sequences while another idles: the kernel keeps its grid (the GPU starts
           each block as an SM frees) and a note says why. Anything else is unchanged.
Preserves: program meaning (each tile's statements run once, in some block) and locations.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from .. import ir, printer, schedule
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
    static = None not in extents
    if static and math.prod(extents) <= sms or not static and len(extents) == 2:
        return kernel
    if any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in kernel.body.stmts):
        return kernel
    if plan_pipeline.run(kernel, config).find_plan(PipelinePlan) is None:
        return kernel
    loc = kernel.loc
    c = lambda v: ir.Const(v, ir.DType.I32, loc)  # noqa: E731
    # a grid sized at launch: each extent clamped at 0 (a launch with one below 1 runs no block;
    # the clamp also tells the emitters that the tile arithmetic divides non-negative numbers)
    grid = [fold(g) if ir.as_int(g) is not None
            else ir.Call(ir.MathFn.MAX, (g, c(0)), ir.DType.I32, loc) for g in kernel.grid]
    total = fold(functools.reduce(
        lambda a, b: ir.BinOp(ir.BinOpKind.MUL, a, b, ir.DType.I32, loc), grid))
    over = (f"{ir.as_int(total)} tiles > {sms} SMs" if static
            else f"{printer.expr(total)} tiles (a grid sized at launch) on {sms} SMs")
    if not static and not _bounds_read_memory(kernel):
        return kernel.with_note(f"persist: {over}, but its tiles' work is not read from memory: "
                                f"a grid sized at launch is made persistent only for tiles whose "
                                f"work is (varlen attention), where it was measured")
    uneven = _work_read_per_tile(kernel)
    if uneven is not None:
        return kernel.with_note(f"persist: {over}, but the T.Pipelined loop at "
                                f"line {uneven.loc.line} runs a number of iterations read from "
                                f"memory at an index of a block index other than a 3-d grid's "
                                f"last (a few tiles per sequence): a deal made in advance would "
                                f"be uneven, so one block per tile (the GPU starts each block as "
                                f"an SM frees)")
    block = ir.Var("block_id", ir.DType.I32, ir.VarKind.BLOCK, loc)
    it = ir.Var("tile_iter", ir.DType.I32, ir.VarKind.LOOP, loc)
    if len(extents) == 2:
        gx, gy = extents
        group = kernel.swizzle_panel or schedule.PANEL_ROWS
        tile = ir.BinOp(ir.BinOpKind.ADD, block, ir.BinOp(ir.BinOpKind.MUL, it, c(sms), ir.DType.I32, loc),
                        ir.DType.I32, loc)
        by, bx = schedule.grouped_tile(tile, c(gy), c(gx), group, loc)
        coords, order = (bx, by), f"in panels of {group} rows"
        count = schedule.tiles_of_block(total, block, c(sms), loc)
    else:
        tile = schedule.serpentine_tile(block, it, sms, loc)
        coords = schedule.launch_order(tile, grid, loc)
        order = "in launch order, rounds of blocks alternating direction"
        count = schedule.serpentine_tiles_of_block(total, block, sms, loc)
    place = dict(zip(kernel.block_vars, coords))
    allocs = tuple(s for s in kernel.body.stmts if isinstance(s, ir.Alloc))
    work = tuple(transform(s, lambda n: place.get(n) if isinstance(n, ir.Var) else None)
                 for s in kernel.body.stmts if not isinstance(s, ir.Alloc))
    tiles = ir.For(it, c(0), count, c(1), ir.ForKind.PERSISTENT, ir.Seq(work, loc), 0, loc)
    out = dataclasses.replace(kernel, grid=(c(sms),), block_vars=(block,), swizzle_panel=0,
                              body=ir.Seq(allocs + (tiles,), kernel.body.loc))
    need = plan_buffers.peak_after("persist", out, config)
    if need > config.caps.smem_bytes:
        return kernel.with_note(f"persist: {over}, but the persistent kernel "
                                f"would need {need} bytes of shared memory (no buffer lends its "
                                f"bytes across tiles), more than the {config.caps.smem_bytes} of "
                                f"target '{config.name}': one block per tile")
    return out.with_note(f"persist: {over}: one block per SM "
                         f"looping over tiles {order}")


def _bound_reads(kernel: ir.Kernel):
    """(pipelined loop, load) for each read of global memory in a pipelined loop's bounds."""
    for s in walk(kernel.body):
        if isinstance(s, ir.For) and s.kind is ir.ForKind.PIPELINED:
            for e in (e for bound in (s.start, s.stop) for e in subexprs(bound)):
                if isinstance(e, ir.Load) and e.buffer.scope is ir.Scope.GLOBAL:
                    yield s, e


def _bounds_read_memory(kernel: ir.Kernel) -> bool:
    return any(True for _ in _bound_reads(kernel))


def _work_read_per_tile(kernel: ir.Kernel):
    """The pipelined loop, where its bounds read global memory at an index holding a block index
    other than a 3-d grid's last (varlen decoding's ``cu_seqlens[b]``, ``b`` a 2-d grid's first
    index); else None."""
    slab = kernel.block_vars[2:]
    for s, e in _bound_reads(kernel):
        if any(isinstance(v, ir.Var) and v.kind is ir.VarKind.BLOCK and v not in slab
               for i in e.indices for v in subexprs(i)):
            return s
    return None
