"""TileLang's ``tilelang.math`` (also at the top level, ``tilelang.cdiv``): integer helpers for
choosing tile sizes and grids."""
from tilews.lowering.frontend.values import ceildiv as cdiv

__all__ = ["cdiv", "next_power_of_2"]


def next_power_of_2(x: int) -> int:
    """The least power of two >= ``x``, for ``x`` >= 1 (as in TileLang, 0 gives 2)."""
    return 1 << (x - 1).bit_length()
