"""Allocation: shared, fragment, local and global buffers, variables and barriers."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.dtypes import POINTER
from tilews.lowering.frontend import pointers, semantic, storage
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


def alloc_local(shape, dtype, scope: str = "local"):
    """Per-thread registers: ``x = T.alloc_local((1,), T.int32)`` then ``x[0] = ...``; the shape
    is an int, tuple or list of build-time ints. ``scope`` is TileLang's, and only ``"local"``."""
    if scope != "local":
        raise semantic.err(f"T.alloc_local(scope={scope!r}): must be 'local'")
    return semantic.alloc(shape, dtype, ir.Scope.LOCAL, builder().name_hint)


def alloc_var(dtype, *args, init=None, scope: str = "local.var"):
    """A scalar variable: ``v = T.alloc_var(T.int32)`` (0 at first), ``T.alloc_var(dtype, init)``,
    ``T.alloc_var(dtype, init=x)``, TileLang's older ``T.alloc_var(dtype, "local.var")`` and
    ``T.alloc_var(dtype, init, scope)``. Assigning to its name afterwards (``v = e``,
    ``v += 1``) stores into the variable, also inside loops and branches; reading the name reads
    its value at that point; ``v[0]`` is the same element. It holds one value per block: every
    thread must give it the same value."""
    if len(args) > 2:
        raise semantic.err(f"T.alloc_var takes dtype, init and scope, got {len(args) + 1} "
                           f"positional arguments")
    if len(args) == 1 and isinstance(args[0], str):
        scope = args[0]
    elif args:
        if init is not None:
            raise semantic.err("T.alloc_var: the initial value is given twice")
        init, scope = (args[0], scope) if len(args) == 1 else args
    return storage.alloc_var(dtype, init, scope, builder().name_hint)


def alloc_global(shape, dtype, scope: str = "global"):
    """A global-memory buffer private to each call (TileLang's workspace, e.g. split-K partial
    results): tilews allocates it on the inputs' device at every call, uninitialized, and passes
    it to the kernel; callers neither pass nor receive it. Write before reading; blocks see each
    other's writes only as global memory allows (no ordering between blocks)."""
    if scope != "global":
        raise semantic.err(f"T.alloc_global(scope={scope!r}): must be 'global'")
    return storage.alloc_global(shape, dtype, builder().name_hint)


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
