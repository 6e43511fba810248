"""Data movement: ``T.copy`` and ``T.tma_copy``."""
from __future__ import annotations

from tilews.lowering.frontend import semantic


def copy(src, dst, barrier=None, *, disable_tma: bool = False, coalesced_width=None):
    """Copy a tile between global, shared and fragment memory. A start index (``A[i, j]``) takes
    the extent of the other side; boundary tiles of global tensors are masked (zero-filled on
    load, not stored out of bounds). With ``barrier=``, a global -> shared copy completes
    asynchronously: its bytes count towards the barrier's current phase. ``disable_tma`` and
    ``coalesced_width`` are TileLang's code-generation hints; they never change results."""
    semantic.copy(src, dst, barrier)


def tma_copy(src, dst, *, barrier=None):
    """TileLang's split-phase copy. Global -> shared: registers the tile's bytes on ``barrier``'s
    current phase and issues the load, neither arriving nor waiting (``T.copy(src, dst,
    barrier=b)``); ``barrier`` is required. Shared -> global: a store the program does not wait
    for."""
    semantic.tma_copy(src, dst, barrier)
