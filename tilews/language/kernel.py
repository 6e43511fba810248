"""Kernels and roles: ``T.prim_func``, ``T.Kernel``, ``T.ws``."""
from __future__ import annotations

import math
import sys

from tilews.lowering.frontend import Macro, kernel_source, semantic


def prim_func(fn):
    """Mark a kernel function; its source is parsed (not run) when the kernel is built."""
    return kernel_source(fn, sys._getframe(1).f_locals)


def macro(fn):
    """``@T.macro``: tile-language statements inlined at each call from a kernel body, their
    parameters bound to the call's arguments; the body may end with ``return value``."""
    return Macro(fn)


def Kernel(*grid, threads=128):
    """``with T.Kernel(gx, gy, threads=N) as (bx, by):`` — a grid of blocks of ``threads`` threads;
    binds the block indices. TileLang's ``threads=(x, y[, z])`` is ``x * y * z`` threads, x
    fastest; thread-level code sees each thread's (x, y, z) through ``T.get_thread_binding``."""
    shape = (threads,)
    if isinstance(threads, (tuple, list)) and threads and all(
            isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in threads):
        shape, threads = tuple(threads), math.prod(threads)
    if len(shape) > 3:
        raise semantic.err(f"T.Kernel(threads=...) takes at most 3 extents (x, y, z), got {shape}")
    return semantic.KernelFrame(grid, threads, shape)


def ws(*warpgroups: int):
    """``with T.ws(g, ...):`` — the body runs on exactly warp groups g... (threads
    [128 g, 128 g + 128)), concurrently with the other roles. ``T.ws(1, 2)`` is one role of two
    warp groups that share its tile operations."""
    return semantic.WsFrame(warpgroups)


def use_swizzle(panel_size: int, order: str = "row", enable: bool = True) -> None:
    """Visit blocks in panels of ``panel_size`` rows for L2 reuse; never changes results.
    ``enable=False`` does nothing. TileLang's other orders ("column", "mlx") are not implemented
    and are refused."""
    if order != "row":
        if order in ("column", "mlx"):
            raise semantic.err(f"T.use_swizzle(order={order!r}) is not supported; only 'row' "
                               f"(the visiting order of blocks never changes results)")
        raise semantic.err(f"T.use_swizzle(order={order!r}): TileLang's orders are 'row', "
                           f"'column' and 'mlx' (tilews has 'row')")
    if enable:
        semantic.use_swizzle(panel_size)
