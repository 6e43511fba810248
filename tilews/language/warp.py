"""Warp-level exchange as CUDA names it: shuffles, warp reductions, ``dp4a``.

A warp is 32 threads of consecutive linear index (``x + X * (y + Y * z)``); a thread's lane is
its linear index modulo 32. These are per-thread code (outside ``T.Parallel``) that every thread
of the block runs; see ``lowering/frontend/cross_thread.py`` for how they lower.
"""
from __future__ import annotations

from tilews.lowering.frontend import cross_thread

FULL_MASK = cross_thread.FULL_MASK


def shfl_xor(value, delta, width: int = 32, mask=FULL_MASK):
    """The ``value`` of lane ``lane ^ delta`` (``__shfl_xor_sync``); a thread whose partner lies
    in a later segment of ``width`` lanes gets its own value."""
    return cross_thread.shuffle("xor", value, delta, width, mask)


def shfl_down(value, delta, width: int = 32, mask=FULL_MASK):
    """The ``value`` of lane ``lane + delta`` (``__shfl_down_sync``); past the end of the
    thread's segment of ``width`` lanes, its own value."""
    return cross_thread.shuffle("down", value, delta, width, mask)


def shfl_up(value, delta, width: int = 32, mask=FULL_MASK):
    """The ``value`` of lane ``lane - delta`` (``__shfl_up_sync``); before the start of the
    thread's segment of ``width`` lanes, its own value."""
    return cross_thread.shuffle("up", value, delta, width, mask)


def shfl_sync(value, srcLane, width: int = 32, mask=FULL_MASK):  # noqa: N803  (TileLang's name)
    """The ``value`` of lane ``srcLane % width`` of the thread's segment of ``width`` lanes
    (``__shfl_sync``): a broadcast within each segment."""
    return cross_thread.shuffle("sync", value, srcLane, width, mask)


def warp_reduce_sum(value):
    """The sum of ``value`` over the thread's warp, in each of its threads."""
    return cross_thread.warp_reduce("sum", value)


def warp_reduce_max(value):
    """The largest ``value`` of the thread's warp, in each of its threads."""
    return cross_thread.warp_reduce("max", value)


def warp_reduce_min(value):
    """The smallest ``value`` of the thread's warp, in each of its threads."""
    return cross_thread.warp_reduce("min", value)


def dp4a(A, B, C):  # noqa: N803  (TileLang's names)
    """``T.dp4a(a[i], b[j], c[k])``: ``c[k] += a[i]*b[j] + ... + a[i+3]*b[j+3]`` over four int8
    elements of each of ``a`` and ``b``, summed in the int32 ``c``."""
    cross_thread.dp4a(A, B, C)
