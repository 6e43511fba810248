"""The thread level: a thread's index inside a kernel, and the block barrier.

Statements outside ``T.Parallel`` and tile operations that read a thread index (or per-thread
storage holding a value computed from one) run per thread; see ``docs/design.md §2`` and
``lowering/frontend/threads.py``.
"""
from __future__ import annotations

from tilews.lowering.frontend import semantic
from tilews.lowering.frontend.context import builder

_AXES = {"threadIdx.x": 0, "threadIdx.y": 1, "threadIdx.z": 2}


def get_thread_binding(dim: int = 0):
    """``tx = T.get_thread_binding(0)``: this thread's index along dimension ``dim`` (0, 1, 2:
    x, y, z) of ``T.Kernel(threads=(x, y, z))``; with ``threads=n``, dimension 0 is 0..n-1."""
    return semantic.thread_index(dim)


def get_thread_bindings():
    """The thread's indices along every dimension of the kernel's ``threads``, x first."""
    return tuple(semantic.thread_index(d) for d in range(len(builder().thread_shape)))


def thread_binding(start, stop=None, thread: str = "threadIdx.x", annotations=None):
    """TileLang's ``T.thread_binding(0, n, thread="threadIdx.x")``: the thread's index along that
    axis, which must have ``n`` threads."""
    if stop is None:
        start, stop = 0, start
    dim = _AXES.get(thread)
    if dim is None:
        raise semantic.err(f"T.thread_binding(thread={thread!r}): use 'threadIdx.x', "
                           f"'threadIdx.y' or 'threadIdx.z'")
    if start != 0 or not isinstance(stop, int):
        raise semantic.err(f"T.thread_binding({start}, {stop}): the range must be 0..n with n "
                           f"known at build time")
    return semantic.thread_index(dim, stop)


def get_block_binding(dim: int = 0):
    """``bx = T.get_block_binding(0)``: the block's index along grid dimension ``dim``."""
    vars_ = builder().kernel["block_vars"] if builder().kernel else ()
    if not isinstance(dim, int) or not 0 <= dim < len(vars_):
        raise semantic.err(f"T.get_block_binding({dim!r}): the kernel's grid has {len(vars_)} "
                           f"dimensions")
    return semantic.Scalar(vars_[dim])


def sync_threads(barrier_id=None, arrive_count=None):
    """``T.sync_threads()``: every thread of the block waits for the others; their shared-memory
    writes before it are visible after it. tilews inserts the barriers thread-level code needs
    itself; an explicit one is kept. Named barriers (``barrier_id``) are not supported."""
    if barrier_id is not None or arrive_count is not None:
        raise semantic.err("T.sync_threads(barrier_id, arrive_count): named barriers over part "
                           "of the block are not supported")
    semantic.sync_threads()
