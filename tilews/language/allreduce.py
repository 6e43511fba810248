"""TVM's thread allreduce, as TileLang programs write it::

    with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, dtype)]), "reduce_scope",
                T.reinterpret(T.uint64(0), dtype="handle")):
        T.evaluate(T.tvm_thread_allreduce(T.uint32(1), value, True, out[0], tk, dtype="handle"))

Every thread stores into ``out[0]`` the reduction of ``value`` over the threads that differ from
it only in the listed thread indices (``tk``). The combiner is ``x + y``, ``T.max(x, y)`` or
``T.min(x, y)``. These TVM names mean nothing else in tilews: any other use is an error at its
line.
"""
from __future__ import annotations

from tilews.lowering.frontend import cross_thread, semantic

_ONLY_FORM = ("tilews provides it only in TVM's thread allreduce: `with T.attr(T.comm_reducer("
              "combiner, [identity]), \"reduce_scope\", T.reinterpret(T.uint64(0), "
              "dtype=\"handle\")): T.evaluate(T.tvm_thread_allreduce(...))`")


def comm_reducer(combiner, identity):
    """A combiner (``lambda x, y: x + y``, ``T.max(x, y)``, ``T.min(x, y)``) and its identity."""
    return cross_thread.comm_reducer(combiner, identity)


def attr(node, key, value):
    """``with T.attr(reducer, "reduce_scope", null handle):`` the scope of a thread allreduce."""
    if (isinstance(node, cross_thread.CommReducer) and key == "reduce_scope"
            and isinstance(value, cross_thread.NullHandle)):
        return cross_thread.ReduceScopeFrame(node)
    raise semantic.err(f"T.attr is TVM's attribute statement; {_ONLY_FORM}")


def tvm_thread_allreduce(*args, dtype="handle"):
    """``T.tvm_thread_allreduce(T.uint32(1), value, cond, out[0], *thread_indices)``."""
    return cross_thread.thread_allreduce(args)


def evaluate(value):
    """``T.evaluate(T.tvm_thread_allreduce(...))``: the allreduce has happened."""
    if not isinstance(value, cross_thread.Allreduced):
        raise semantic.err(f"T.evaluate is TVM's expression statement; {_ONLY_FORM}")
