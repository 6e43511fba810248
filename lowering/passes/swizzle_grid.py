"""swizzle_grid: visit the blocks of a 2-d grid in panels (``T.use_swizzle(panel)``) for L2 reuse.

Requires:  persist has run (a persistent kernel visits its tiles in its own panels and has
           ``swizzle_panel`` 0), and so have the passes that read a block index's range from its
           grid extent (legalize's interval analysis).
Ensures:   a kernel with ``swizzle_panel`` = P > 0 and a grid (gx, gy, ...) of two or more
           dimensions gets the grid (gx * gy, ...), whose first block index ``block_id`` replaces
           (bx, by), which become ``Kernel.block_defs``: the coordinates of tile ``block_id`` in
           ``schedule.grouped_tile`` order (panels of P values of by, the last one possibly
           shorter; bx varies slowest within a panel), computed once per block; the body is
           unchanged. Every kernel leaves with ``swizzle_panel``
           0, so emitters launch the grid as it stands.
Preserves: program meaning (the grouped order is a bijection of the gx * gy blocks, so each
           former block runs once) and every node's loc.
"""
from __future__ import annotations

import dataclasses

from .. import ir, schedule
from ..simplify import fold
from ..config import BackendConfig
from ..traverse import fresh_name


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if not kernel.swizzle_panel:
        return kernel
    if len(kernel.grid) < 2:
        return dataclasses.replace(kernel, swizzle_panel=0)
    loc = kernel.loc
    (gx, gy, *more_grid), (bx, by, *more_vars) = kernel.grid, kernel.block_vars
    block = ir.Var(fresh_name(kernel, "block_id"), ir.DType.I32, ir.VarKind.BLOCK, loc)
    y, x = schedule.grouped_tile(block, gy, gx, kernel.swizzle_panel, loc)
    blocks = fold(ir.BinOp(ir.BinOpKind.MUL, gx, gy, ir.DType.I32, loc))
    return dataclasses.replace(kernel, grid=(blocks, *more_grid), block_vars=(block, *more_vars),
                               swizzle_panel=0, block_defs=((by, y), (bx, x)) + kernel.block_defs)
