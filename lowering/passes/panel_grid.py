"""panel_grid: a 2-d grid of GEMM tiles whose program leaves the block order open visits them in
panels, as ``T.use_swizzle`` would, so the blocks running together share their operands in L2.

Requires:  after ``persist`` (a persistent kernel has a 1-d grid and orders its own tiles), before
           ``swizzle_grid``, which carries out the order chosen here.
Ensures:   a kernel with no ``T.use_swizzle`` (``swizzle_panel`` 0), a grid (gx, gy) of two static
           extents bound to (bx, by) with more blocks than ``config.caps.num_sms`` (known), that
           copies boxes of one global buffer at starts reading ``by`` but not ``bx`` (a GEMM's row
           panel of A, shared by a row of blocks) and of another at starts reading ``bx`` but not
           ``by`` (the column panel of B), gets ``swizzle_panel`` = ``schedule.PANEL_ROWS`` and a
           note. Launched in order, the blocks in flight at 8192^3 in 128x128 tiles (132 of a
           64 x 64 grid) span 2-3 rows and all 64 columns: each wave reads all of B from memory;
           in panels of 16 rows they span 16 rows and about 8 columns. Anything else: unchanged.
Preserves: program meaning (blocks run in no order a program may rely on; the panel order is a
           bijection, ``swizzle_grid``) and locations.
"""
from __future__ import annotations

import dataclasses

from .. import ir, schedule
from ..config import BackendConfig
from ..simplify import evaluate
from ..traverse import subexprs, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if kernel.swizzle_panel or len(kernel.grid) != 2 or not config.caps.num_sms:
        return kernel
    extents = [evaluate(g) for g in kernel.grid]
    if None in extents or extents[0] * extents[1] <= config.caps.num_sms:
        return kernel
    bx, by = kernel.block_vars
    reads = {(c.src.buffer, _reading(c.src.starts, bx), _reading(c.src.starts, by))
             for c in walk(kernel.body) if isinstance(c, ir.Copy)
             and c.src.buffer.scope is ir.Scope.GLOBAL}
    rows = {b for b, x, y in reads if y and not x}
    columns = {b for b, x, y in reads if x and not y}
    if not rows or not columns or rows == columns:
        return kernel
    return dataclasses.replace(kernel, swizzle_panel=schedule.PANEL_ROWS).with_note(
        f"panel_grid: the {extents[0]} x {extents[1]} blocks read row panels of "
        f"{', '.join(sorted(b.name for b in rows))} and column panels of "
        f"{', '.join(sorted(b.name for b in columns))} and the program leaves their order open "
        f"(no T.use_swizzle): visited in panels of {schedule.PANEL_ROWS} rows, so the blocks "
        f"running together share those panels in L2")


def _reading(starts, var: ir.Var) -> bool:
    return any(var == t for e in starts for t in subexprs(e))
