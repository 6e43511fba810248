"""Allocation: shared, fragment, local buffers and barriers."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.dtypes import POINTER
from tilews.lowering.frontend import pointers, semantic
from tilews.lowering.frontend.context import builder


def alloc_shared(shape, dtype, scope: str = "shared.dyn"):
    """A tile in shared memory, visible to every thread of the block. ``scope`` ("shared.dyn" or
    "shared", TileLang's static/dynamic shared memory) does not matter: tilews plans all of it."""
    if scope not in ("shared", "shared.dyn"):
        raise semantic.err(f"T.alloc_shared(scope={scope!r}): must be 'shared.dyn' or 'shared'")
    return semantic.alloc(shape, dtype, ir.Scope.SHARED, builder().name_hint)


def alloc_fragment(shape, dtype):
    """A register tile spread over the threads of the role that uses it."""
    return semantic.alloc(shape, dtype, ir.Scope.FRAGMENT, builder().name_hint)


def alloc_local(shape, dtype):
    """Per-thread registers."""
    return semantic.alloc(shape, dtype, ir.Scope.LOCAL, builder().name_hint)


def alloc_barrier(arrive_count):
    """mbarriers counting arriving *threads* (128 = one warp group); a list gives several."""
    counts = list(arrive_count) if isinstance(arrive_count, (list, tuple)) else [arrive_count]
    return semantic.alloc_barriers(counts, builder().name_hint)


def create_list_of_mbarrier(*arrive_counts):
    """TileLang spelling: the kernel's list of mbarriers, reached with ``T.get_mbarrier(i)``."""
    if len(arrive_counts) == 1 and isinstance(arrive_counts[0], (list, tuple)):
        arrive_counts = tuple(arrive_counts[0])
    semantic.mbarrier_list(arrive_counts)


def get_mbarrier(i):
    return semantic.get_mbarrier(i)


ptr = POINTER


def make_tensor(address, shape, dtype=None, strides=None):
    """A global tensor at a device address read in the kernel: ``address`` is an element of a
    pointer table (a ``T.Tensor([n], T.ptr)`` parameter holding ``t.data_ptr()`` of each tensor),
    ``shape`` a tuple of positive ints or runtime integers, ``dtype`` the element type, ``strides``
    (elements) row-major unless given. Used like a tensor parameter (``T.copy(A[m, k], A_s)``);
    accesses outside ``shape`` are masked. Copies of it never use TMA (its address is unknown at
    launch). Not on Metal."""
    return pointers.make_tensor(address, shape, dtype, strides, builder().name_hint)
