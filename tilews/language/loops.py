"""Loops: ``T.Pipelined``, ``T.serial``, ``T.unroll``, ``T.Parallel``."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import semantic


def Pipelined(start, stop=None, num_stages: int = 0, **hints):
    """A loop whose global -> shared copies are overlapped with compute, ``num_stages`` deep.
    Hints (``order``, ``stage``, ``group``) never change results."""
    return semantic.LoopFrame(ir.ForKind.PIPELINED, start, stop, 1, num_stages)


def serial(start, stop=None, step=1):
    return semantic.LoopFrame(ir.ForKind.SERIAL, start, stop, step)


def unroll(start, stop=None, step=1):
    return semantic.LoopFrame(ir.ForKind.UNROLL, start, stop, step)


def Persistent(domain, wave_size, index, group_size: int = 8):
    """``for bx, by in T.Persistent([tiles_0, tiles_1], num_sms, block_id):`` inside
    ``T.Kernel(num_sms)`` — each block loops over output tiles block_id, block_id + num_sms, ...
    in panels of ``group_size`` tiles along dimension 0 (L2-friendly); the body is one tile."""
    return semantic.PersistentFrame(domain, wave_size, index, group_size)


def Parallel(*extents):
    """``for i, j in T.Parallel(M, N):`` — element-wise; iterations are independent."""
    return semantic.ParallelFrame(extents)
