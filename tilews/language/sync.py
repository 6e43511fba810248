"""Barriers between roles (TileLang's spellings included)."""
from __future__ import annotations

from tilews.lowering.frontend import semantic


def barrier_arrive(barrier):
    """Every thread of the current role arrives on ``barrier``."""
    semantic.barrier_arrive(barrier)


def barrier_wait(barrier, parity):
    """Wait until the phase of ``barrier`` with parity ``parity`` has completed (a fresh barrier
    passes a wait on parity 1 at once)."""
    semantic.barrier_wait(barrier, parity)


mbarrier_arrive = barrier_arrive
mbarrier_wait_parity = barrier_wait
