"""Reductions and scans over one dimension of a tile; reducers that T.Parallel iterations
combine into."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import semantic
from tilews.lowering.frontend.context import builder
from tilews.lowering.frontend.values import BufferRef


def _reduce(kind: ir.ReduceKind):
    def op(src, dst, dim: int = -1, clear: bool = True):
        semantic.reduce(kind, src, dst, dim, clear)
    op.__name__ = f"reduce_{kind.value}"
    op.__doc__ = (f"``dst = {kind.value}(src, dim)``; with ``clear=False`` the result is combined "
                  f"with dst's current value.")
    return op


reduce_max = _reduce(ir.ReduceKind.MAX)
reduce_min = _reduce(ir.ReduceKind.MIN)
reduce_sum = _reduce(ir.ReduceKind.SUM)
reduce_abssum = _reduce(ir.ReduceKind.ABSSUM)
reduce_absmax = _reduce(ir.ReduceKind.ABSMAX)


def cumsum(src, dst=None, dim: int = 0, reverse: bool = False):
    """Inclusive prefix sums of an on-chip buffer along ``dim`` into ``dst`` (by default ``src``
    itself, in place): ``dst[..., i, ...] = src[..., 0, ...] + ... + src[..., i, ...]``; with
    ``reverse=True`` the sums run from the end of the dim. ``dst`` has ``src``'s shape and dtype;
    float sums are accumulated in float32 at least."""
    semantic.cumsum(src, dst, dim, reverse)


_REDUCER_OPS = {"sum": ir.ReduceKind.SUM, "max": ir.ReduceKind.MAX, "min": ir.ReduceKind.MIN}


def alloc_reducer(shape, dtype, op: str = "sum", replication=None):
    """A fragment the iterations of a ``T.Parallel`` combine into: ``r[i] += v`` (``op="sum"``),
    ``r[i] = T.max(r[i], v)`` (``"max"``), ``r[i] = T.min(r[i], v)`` (``"min"``) combines the
    ``v`` of every iteration sharing ``i`` (a reduction over the other indices, not a race).
    ``T.clear``/``T.fill`` set it as any fragment (a fill value counts once); ``T.copy`` and
    element reads see the combined values once the ``T.Parallel`` ends. ``replication``
    (TileLang's ``"all"``/``"none"``: how it places partial results on threads) changes no
    result. TileLang's later form (``T.reducer_init``/``T.reducer_update``) is not provided."""
    kind = _REDUCER_OPS.get(op)
    if kind is None:
        raise semantic.err(f"T.alloc_reducer(op={op!r}): tilews reducers combine with "
                           f"{', '.join(repr(o) for o in _REDUCER_OPS)}")
    if replication not in (None, "all", "none"):
        raise semantic.err(f"T.alloc_reducer(replication={replication!r}): must be 'all' or 'none'")
    ref = semantic.alloc(shape, dtype, ir.Scope.FRAGMENT, builder().name_hint)
    builder().reducers[ref.buffer] = kind
    return ref


def finalize_reducer(reducer, dst=None, batch: int = 1, annotations=None):
    """TileLang's end of a reducer's accumulation. In tilews every ``T.Parallel`` completes its
    updates when it ends, so there is nothing left to do; ``reducer`` must be a reducer."""
    if not (isinstance(reducer, BufferRef) and reducer.buffer in builder().reducers):
        raise semantic.err(f"T.finalize_reducer takes a buffer of T.alloc_reducer, got {reducer!r}")
    if dst is not None:
        raise semantic.err("T.finalize_reducer(reducer, dst) is TileLang's later reducer form "
                           "(with T.reducer_init / T.reducer_update), which tilews does not "
                           "provide: use T.alloc_reducer(..., replication=...) and "
                           "T.finalize_reducer(reducer), then T.copy")
