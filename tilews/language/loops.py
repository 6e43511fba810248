"""Loops: ``T.Pipelined``, ``T.serial``, ``T.unroll``, ``T.vectorized``, ``T.Parallel``,
``T.Persistent`` (and TileLang's capitalized aliases ``T.Serial``, ``T.Unroll``, ``T.Vectorized``).
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import semantic


def Pipelined(start, stop=None, num_stages: int = 0, order=None, stage=None, sync=None,
              group=None, annotations=None):
    """``for k in T.Pipelined(n, num_stages=s)`` or ``(start, stop, s)``: a loop whose
    global -> shared copies are overlapped with compute, ``num_stages`` deep (TileLang's third
    positional argument is ``num_stages``; the step is 1). TileLang's schedule hints ``order``,
    ``stage``, ``sync``, ``group`` and ``annotations`` are accepted; tilews plans the pipeline
    itself, and no hint changes results. Around explicit ``T.ws`` roles the roles are the
    pipeline, and the loop is a serial one."""
    return semantic.LoopFrame(ir.ForKind.PIPELINED, start, stop, 1, num_stages)


def serial(start, stop=None, step=None, *, annotations=None):
    """``for i in T.serial(n)`` / ``(start, stop[, step])``: a sequential loop (``range`` in a
    kernel is the same). ``annotations`` (TileLang's loop attributes) change nothing."""
    return semantic.LoopFrame(ir.ForKind.SERIAL, start, stop, 1 if step is None else step)


def unroll(start, stop=None, step=None, *, explicit: bool = False, unroll_factor=None,
           annotations=None):
    """A sequential loop the backend may unroll. TileLang's ``explicit`` (unroll in the
    frontend), ``unroll_factor`` and ``annotations`` are hints that change no result; ``explicit``
    and ``unroll_factor`` exclude each other, as in TileLang."""
    if explicit and unroll_factor is not None:
        raise semantic.err("T.unroll: explicit and unroll_factor exclude each other")
    return semantic.LoopFrame(ir.ForKind.UNROLL, start, stop, 1 if step is None else step)


def vectorized(start, stop=None, *, annotations=None):
    """A loop whose iterations are independent and touch contiguous elements. tilews runs it as
    a sequential loop (``T.serial``): any order of independent iterations gives the same result,
    and the body may hold what a serial loop's may (per-thread ``T.alloc_local`` stores, tile
    operations). In per-thread code its iterations become one more parallel dimension (a
    thread's vector), where its bounds are known at build time."""
    return semantic.LoopFrame(ir.ForKind.SERIAL, start, stop, 1, vectorized=True)


Serial, Unroll, Vectorized = serial, unroll, vectorized


def Persistent(domain, wave_size, index, group_size: int = 8):
    """``for bx, by in T.Persistent([tiles_0, tiles_1], num_sms, block_id):`` inside
    ``T.Kernel(num_sms)`` — each block loops over output tiles block_id, block_id + num_sms, ...
    in panels of ``group_size`` tiles along dimension 0 (L2-friendly); the body is one tile.
    ``for u in T.Persistent([units], num_sms, block_id):`` binds the unit number instead
    (block_id, block_id + num_sms, ... < units), for bodies that map units to work themselves
    (``T.grouped_tile`` gives a tile number's coordinates in the same panel order)."""
    return semantic.PersistentFrame(domain, wave_size, index, group_size)


def grouped_tile(tile, domain, group_size: int = 8):
    """``by, bx = T.grouped_tile(t, [tiles_0, tiles_1], group_size)``: the coordinates of tile
    number ``t`` when the domain is visited in panels of ``group_size`` along dimension 0, as
    ``T.Persistent`` visits it."""
    return semantic.grouped_tile(tile, domain, group_size)


def Parallel(*extents, coalesced_width=None, loop_layout=None, prefer_async=None,
             annotations=None):
    """``for i, j in T.Parallel(M, N):`` — element-wise; iterations are independent. TileLang's
    hints ``coalesced_width``, ``loop_layout``, ``prefer_async`` and ``annotations`` are
    accepted; tilews lays out and vectorizes the loop itself."""
    return semantic.ParallelFrame(extents)
