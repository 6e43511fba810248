"""Matrix multiply: ``T.gemm``."""
from __future__ import annotations

from tilews.lowering.frontend import semantic


def gemm(A, B, C, transpose_A: bool = False, transpose_B: bool = False, clear_accum: bool = False,
         **hints):
    """``C += op(A) @ op(B)`` (``C = ...`` with ``clear_accum``); A and B in shared memory or
    fragments, C a fragment. Scheduling hints (``policy=``, ``k_pack=``) never change results."""
    semantic.gemm(A, B, C, transpose_A, transpose_B, clear_accum)
