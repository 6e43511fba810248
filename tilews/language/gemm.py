"""Matrix multiply: ``T.gemm`` and ``T.GemmWarpPolicy``."""
from __future__ import annotations

import enum

from tilews.lowering import ir
from tilews.lowering.frontend import semantic


class GemmWarpPolicy(enum.IntEnum):
    """How TileLang spreads a gemm's warps over the tile (rows, columns or both). A scheduling
    hint: tilews picks its own partition (docs/ws-semantics.md #3), results never change."""
    Square = 0
    FullRow = 1
    FullCol = 2


def gemm(A, B, C, transpose_A: bool = False, transpose_B: bool = False,
         policy=GemmWarpPolicy.Square, clear_accum: bool = False, k_pack: int = 1,
         wg_wait: int = 0, precision: str = "tf32"):
    """``C += op(A) @ op(B)`` (``C = ...`` with ``clear_accum``); A and B in shared memory or
    fragments, C a fragment. ``policy``, ``k_pack`` (AMD's packed matrix cores) and ``wg_wait``
    (how many wgmma groups may stay in flight) are hints: the result is complete when the next
    statement runs, whatever their values. ``precision`` (float32 operands only): ``"tf32"``
    lets GPU tensor cores round the operands to tf32 (wgmma on Hopper), ``"ieee"`` asks for
    exact float32 products (``triton.language``'s ``tl.dot(input_precision="ieee")``, never
    wgmma); the interpreter, Metal and Triton's CPU interpreter are exact either way."""
    if precision not in ("tf32", "ieee"):
        raise semantic.err(f"T.gemm(precision={precision!r}): must be 'tf32' or 'ieee'")
    if policy not in tuple(GemmWarpPolicy):
        raise semantic.err(f"T.gemm(policy={policy!r}): must be a T.GemmWarpPolicy "
                           f"(Square, FullRow, FullCol)")
    for name, value, low in (("k_pack", k_pack, 1), ("wg_wait", wg_wait, -1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise semantic.err(f"T.gemm({name}={value!r}): must be an int >= {low}")
    semantic.gemm(A, B, C, transpose_A, transpose_B, clear_accum, ir.GemmPrecision(precision))
