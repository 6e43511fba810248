"""The meaning of an FP8 scaled matmul's scales: which granularity a pair of scale shapes selects.

``(A @ B)`` with A [M, K], B [K, N] (FP8), accumulated in float32, scaled by float32 scales whose
shapes decide the granularity (docs/fp8.md):

* per tensor: A_scale [] or [1], B_scale [] or [1];
* per row / column: A_scale [M] or [M, 1], B_scale [N] or [1, N] (either side may instead be per
  tensor: a row scale times a tensor scale is still an outer product);
* block-wise: A_scale [M, ceil(K / 128)] (1 x 128 blocks of A), B_scale [ceil(N / 128),
  ceil(K / 128)] (128 x 128 blocks of B): the partial product of each 128-wide k-block is scaled
  and promoted into the float32 accumulator.

Pure shape logic, shared by the tile language's ``T.fp8_scaled_matmul`` and ``tilews.ops``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

SCALE_BLOCK = 128                 # k-block (and B's n-block) of the block-wise form


class Scaling(enum.Enum):
    TENSOR = "tensor"             # one scale for the operand
    ROW = "row"                   # one per row of A / column of B
    BLOCK = "block"               # one per 128-wide k-block (A: per row; B: per 128 columns)


@dataclass(frozen=True)
class Granularity:
    a: Scaling
    b: Scaling

    @property
    def block_wise(self) -> bool:
        return self.a is Scaling.BLOCK


def scale_blocks(n: int) -> int:
    """How many 128-wide scale blocks cover n elements."""
    return -(-n // SCALE_BLOCK)


def accepted(M: int, N: int, K: int) -> str:
    """The scale shapes accepted for an M x N x K product, in words."""
    kb, nb = scale_blocks(K), scale_blocks(N)
    return (f"per tensor: A_scale [] or [1] and B_scale [] or [1]; per row / column: A_scale [{M}] "
            f"or [{M}, 1] and B_scale [{N}] or [1, {N}] (either may be per tensor); block-wise: "
            f"A_scale [{M}, {kb}] and B_scale [{nb}, {kb}]")


def _outer(shape: tuple, n: int, vector: tuple):
    """TENSOR or ROW if ``shape`` is a per-tensor or per-row (per-column) scale of n entries."""
    if shape in ((), (1,)) or (n == 1 and shape == vector):
        return Scaling.TENSOR
    if shape in ((n,), vector):
        return Scaling.ROW
    return None


def granularity(M: int, N: int, K: int, a_scale: tuple, b_scale: tuple) -> Granularity:
    """The granularity selected by the scale shapes, or a ``ValueError`` listing the accepted
    shapes. Where both readings fit (K <= 128 and N == 1), they mean the same numbers."""
    a_scale, b_scale = tuple(a_scale), tuple(b_scale)
    a, b = _outer(a_scale, M, (M, 1)), _outer(b_scale, N, (1, N))
    if a is not None and b is not None:
        return Granularity(a, b)
    kb, nb = scale_blocks(K), scale_blocks(N)
    if a_scale == (M, kb) and b_scale == (nb, kb):
        return Granularity(Scaling.BLOCK, Scaling.BLOCK)
    raise ValueError(f"scale shapes A_scale {list(a_scale)} and B_scale {list(b_scale)} match no "
                     f"granularity for M={M}, N={N}, K={K}; accepted: {accepted(M, N, K)}")
