"""Data movement: ``T.copy``."""
from __future__ import annotations

from tilews.lowering.frontend import semantic


def copy(src, dst, barrier=None):
    """Copy a tile between global, shared and fragment memory. A start index (``A[i, j]``) takes
    the extent of the other side; boundary tiles of global tensors are masked (zero-filled on
    load, not stored out of bounds). With ``barrier=``, a global -> shared copy completes
    asynchronously: its bytes count towards the barrier's current phase."""
    semantic.copy(src, dst, barrier)
