"""Reductions and scans over one dimension of a tile."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import semantic


def _reduce(kind: ir.ReduceKind):
    def op(src, dst, dim: int = -1, clear: bool = True):
        semantic.reduce(kind, src, dst, dim, clear)
    op.__name__ = f"reduce_{kind.value}"
    op.__doc__ = (f"``dst = {kind.value}(src, dim)``; with ``clear=False`` the result is combined "
                  f"with dst's current value.")
    return op


reduce_max = _reduce(ir.ReduceKind.MAX)
reduce_min = _reduce(ir.ReduceKind.MIN)
reduce_sum = _reduce(ir.ReduceKind.SUM)
reduce_abssum = _reduce(ir.ReduceKind.ABSSUM)
reduce_absmax = _reduce(ir.ReduceKind.ABSMAX)


def cumsum(src, dst=None, dim: int = 0, reverse: bool = False):
    """Inclusive prefix sums of an on-chip buffer along ``dim`` into ``dst`` (by default ``src``
    itself, in place): ``dst[..., i, ...] = src[..., 0, ...] + ... + src[..., i, ...]``; with
    ``reverse=True`` the sums run from the end of the dim. ``dst`` has ``src``'s shape and dtype;
    float sums are accumulated in float32 at least."""
    semantic.cumsum(src, dst, dim, reverse)
