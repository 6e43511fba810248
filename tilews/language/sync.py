"""Barriers between roles, in TileLang's spellings (``mbarrier`` is the parameter's name).

A barrier is ``T.alloc_barrier(...)``'s buffer (meaning its element 0) or one element of it
(``mbars[i]``, any integer expression).
"""
from __future__ import annotations

from tilews.lowering.frontend import semantic


def barrier_arrive(mbarrier):
    """Every thread of the current role arrives on ``mbarrier``."""
    semantic.barrier_arrive(mbarrier)


def barrier_wait(mbarrier, parity):
    """Wait until the phase of ``mbarrier`` with parity ``parity`` has completed (a fresh barrier
    passes a wait on parity 1 at once)."""
    semantic.barrier_wait(mbarrier, parity)


def mbarrier_arrive(mbarrier, cta_id=None):
    """``T.barrier_arrive``; ``cta_id`` (a remote block of a cluster) is not supported."""
    if cta_id is not None:
        raise semantic.err("T.mbarrier_arrive(cta_id=...): arriving on another block's barrier "
                           "(thread-block clusters) is not supported")
    semantic.barrier_arrive(mbarrier)


mbarrier_wait_parity = barrier_wait
