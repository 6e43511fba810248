"""Communication across the threads of a block, written as per-thread code.

A thread reading other threads' values (TVM's ``tvm_thread_allreduce``, warp shuffles, warp
reductions) is built from three ordinary steps, so that ``threads.lower`` gives every pass and
backend only per-thread ``Parallel``s of stores and loads and a block-wide ``Reduce``:

* publish: a per-thread store of the value into a fragment with one element per thread,
  indexed by the thread's (z, y, x);
* combine (reductions): a block-wide ``Reduce`` of that fragment over the dims that are combined,
  one dim at a time;
* read back: a per-thread load at the element the thread wants (its own group's reduction, or
  the partner thread's value), stored into a fresh per-thread local, whose value the operation
  returns (a name bound to it keeps it).

Warps are 32 threads of consecutive linear index ``x + X * (y + Y * z)``; a warp reduction is a
butterfly of shuffles.

Every operation here is per-thread code: inside ``T.Parallel`` it is an error. All threads of the
block take part (the combine step is block-wide), so under a per-thread condition it is the thread
level's error at the user's line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .. import ir
from . import semantic
from .threads import linear_thread
from .context import builder, current_loc
from .values import BufferRef, ElementRef, Scalar, to_expr

WARP = 32
_I32 = ir.DType.I32


# ----------------------------------------------------------------------------------------------
# the steps


def _threads(what: str) -> tuple[tuple[Scalar, ...], tuple[int, ...]]:
    """The thread indices and counts of the open kernel, slowest first (z, y, x)."""
    b = builder()
    if b.kernel is None:
        raise semantic.err(f"{what} exists inside `with T.Kernel(...)` only")
    if b.parallel_vars:
        raise semantic.err(f"{what} is per-thread code: use it outside T.Parallel")
    dims = tuple(reversed(range(len(b.thread_shape))))
    return (tuple(semantic.thread_index(d) for d in dims),
            tuple(b.thread_shape[d] for d in dims))


def _linear(indices: Sequence[Scalar], counts: Sequence[int]) -> Scalar:
    """The thread's linear index (x fastest) from its (z, y, x) indices."""
    return Scalar(linear_thread([i.expr for i in indices], counts, current_loc()))


def _unlinear(lin, counts: Sequence[int]) -> tuple:
    """The (z, y, x) indices of the thread of linear index ``lin``."""
    out = []
    for n in reversed(counts[1:]):
        out.append(lin % n)
        lin = lin // n
    return (lin,) + tuple(reversed(out))


def _publish(value, dtype: ir.DType, shape: tuple[int, ...], at: tuple, name: str) -> ir.Buffer:
    """A fresh fragment of ``shape`` holding each thread's ``value`` at its index ``at``."""
    frag = semantic.alloc(shape, dtype, ir.Scope.FRAGMENT, name).buffer
    semantic.store(ElementRef(frag, tuple(to_expr(i, _I32) for i in at)), value)
    return frag


def _read_back(frag: ir.Buffer, at: tuple, name: str) -> Scalar:
    """``frag[at]`` in each thread, kept in a fresh per-thread local."""
    value = Scalar(ir.Load(frag, tuple(to_expr(i, _I32) for i in at), current_loc()))
    local = semantic.alloc((1,), frag.dtype, ir.Scope.LOCAL, name).buffer
    zero = (ir.Const(0, _I32, current_loc()),)
    semantic.store(ElementRef(local, zero), value)
    return Scalar(ir.Load(local, zero, current_loc()))


def _reduce(kind: ir.ReduceKind, value, dtype: ir.DType, shape: tuple[int, ...], at: tuple,
            dims: Sequence[int], name: str) -> Scalar:
    """Each thread's ``value`` published at ``at`` of a ``shape`` fragment, combined over
    ``dims`` of it, and each thread's group result read back."""
    frag = _publish(value, dtype, shape, at, name)
    shape, at = list(shape), list(at)
    for d in sorted(dims, reverse=True):
        shape.pop(d)
        at.pop(d)
        out = semantic.alloc(tuple(shape) or (1,), dtype, ir.Scope.FRAGMENT, name).buffer
        builder().emit(ir.Reduce(kind, frag, out, d, True, current_loc()))
        frag = out
    return _read_back(frag, tuple(at) or (0,), name + "_out")


# ----------------------------------------------------------------------------------------------
# TVM's thread allreduce


@dataclass(frozen=True)
class CommReducer:
    """``T.comm_reducer(combiner, [identity])``: the combiner, recognised as a reduction kind."""
    kind: ir.ReduceKind
    identity: object


@dataclass(frozen=True)
class NullHandle:
    """``T.reinterpret(T.uint64(0), dtype="handle")``: the null handle ``T.attr`` takes."""


@dataclass(frozen=True)
class Allreduced:
    """What ``T.tvm_thread_allreduce`` returns: nothing to evaluate (``T.evaluate`` takes it)."""


def comm_reducer(combiner, identity) -> CommReducer:
    """Recognise ``combiner`` (called on two symbolic operands) as sum, max or min."""
    if not callable(combiner) or not isinstance(identity, (list, tuple)) or len(identity) != 1:
        raise semantic.err("T.comm_reducer(combiner, [identity]) takes a two-operand function and "
                           "a list of one identity value (tilews reduces one value at a time)")
    dtype = identity[0].dtype if isinstance(identity[0], Scalar) else ir.DType.F32
    x, y = (ir.Var(n, dtype, ir.VarKind.LOOP, current_loc()) for n in ("x", "y"))
    out = combiner(Scalar(x), Scalar(y))
    e = out.expr if isinstance(out, Scalar) else None
    operands = {e.a, e.b} if isinstance(e, ir.BinOp) else set(e.args) if isinstance(e, ir.Call) else ()
    kind = None
    if operands == {x, y}:
        kind = ({ir.BinOpKind.ADD: ir.ReduceKind.SUM}.get(e.op) if isinstance(e, ir.BinOp) else
                {ir.MathFn.MAX: ir.ReduceKind.MAX, ir.MathFn.MIN: ir.ReduceKind.MIN}.get(e.fn))
    if kind is None:
        from ..printer import expr
        got = expr(e) if e is not None else repr(out)
        raise semantic.err(f"T.comm_reducer: the combiner gives {got} for operands x, y; tilews "
                           f"reduces across threads with x + y, T.max(x, y) or T.min(x, y) only")
    return CommReducer(kind, identity[0])


def null_handle(value) -> NullHandle:
    if ir.as_int(to_expr(value, None)) != 0:
        raise semantic.err("T.reinterpret(..., dtype=\"handle\"): tilews has no raw pointers; the "
                           "one handle it accepts is the null handle of T.attr(T.comm_reducer(...), "
                           "\"reduce_scope\", T.reinterpret(T.uint64(0), dtype=\"handle\"))")
    return NullHandle()


class ReduceScopeFrame(semantic.Frame):
    """``with T.attr(T.comm_reducer(...), "reduce_scope", null handle):`` — the body's
    ``T.tvm_thread_allreduce`` combines with that reducer."""

    def __init__(self, reducer: CommReducer):
        self.reducer = reducer

    def enter(self, names):
        builder().reduce_scopes.append(self.reducer)

    def exit(self, body):
        b = builder()
        b.reduce_scopes.pop()
        for s in body:
            b.emit(s)


def thread_allreduce(args: Sequence) -> Allreduced:
    """``T.tvm_thread_allreduce(1, value, cond, out, *thread_indices)``: every thread stores into
    ``out`` the reduction of ``value`` over the threads that differ from it only in the given
    thread indices (a thread whose ``cond`` is false contributes the reducer's identity)."""
    b = builder()
    what = "T.tvm_thread_allreduce"
    if not b.reduce_scopes:
        raise semantic.err(f"{what} takes its combiner from an enclosing `with T.attr("
                           f"T.comm_reducer(...), \"reduce_scope\", ...)`; there is none")
    reducer = b.reduce_scopes[-1]
    if len(args) < 4 or ir.as_int(to_expr(args[0], None)) != 1:
        raise semantic.err(f"{what}(size, value, cond, out, *thread_indices): tilews reduces one "
                           f"value (size 1)")
    _, value, cond, out, *over = args
    if not isinstance(out, ElementRef):
        raise semantic.err(f"{what}: the result goes to a buffer element (out[0]), got {out!r}")
    indices, counts = _threads(what)
    dims = [_thread_dim(v, indices, counts, what) for v in over]
    if not dims or len(set(dims)) != len(dims):
        raise semantic.err(f"{what}: name each thread index to reduce over once")
    dtype = out.buffer.dtype
    if cond is not True:        # a thread whose condition is false contributes the identity
        value = semantic.select(cond, value, reducer.identity)
    result = _reduce(reducer.kind, value, dtype, counts, indices, dims, "allreduce")
    semantic.store(out, result)
    return Allreduced()


def _thread_dim(v, indices: Sequence[Scalar], counts: Sequence[int], what: str) -> int:
    """The position (z, y, x order) of the thread index ``v`` among the kernel's."""
    for pos, index in enumerate(indices):
        if isinstance(v, Scalar) and v.expr is index.expr:
            return pos
    b = builder()
    if isinstance(v, Scalar) and isinstance(v.expr, ir.Var) and v.expr.kind is ir.VarKind.THREAD:
        dim = next(d for d, var in b.thread_vars.items() if var is v.expr)
        raise semantic.err(f"{what} reduces over thread dimension {'xyz'[dim]}, which the kernel "
                           f"does not have (T.Kernel(threads={_threads_spelling(b)}))")
    raise semantic.err(f"{what} reduces over thread indices (T.get_thread_binding, "
                       f"T.thread_binding); {v!r} is not one")


def _threads_spelling(b) -> str:
    shape = b.thread_shape
    return str(shape[0]) if len(shape) == 1 else str(shape)


# ----------------------------------------------------------------------------------------------
# warps


FULL_MASK = 0xFFFFFFFF
_COMBINE = {"max": ir.MathFn.MAX, "min": ir.MathFn.MIN}


def warp_reduce(kind: str, value) -> Scalar:
    """``T.warp_reduce_<kind>(value)``: the reduction of ``value`` over the 32 threads of the
    thread's warp, in every one of them: a butterfly of ``xor`` shuffles (every lane combines the
    same values in the same pairs, so all get the same result)."""
    _threads(f"T.warp_reduce_{kind}")
    out = Scalar(to_expr(value, None))
    for delta in (16, 8, 4, 2, 1):
        other = shuffle("xor", out, delta, WARP, FULL_MASK)
        out = out + other if kind == "sum" else semantic.math_call(_COMBINE[kind], out, other)
    return out


def shuffle(mode: str, value, arg, width: int, mask) -> Scalar:
    """CUDA's ``__shfl_<mode>_sync(mask, value, arg, width)``: the ``value`` of another lane of
    the thread's warp, lanes counted by linear thread index; ``width`` splits the warp into
    segments. ``xor``: lane ^ arg, own value where that lies in a later segment; ``down``/``up``:
    lane + arg / lane - arg, own value past the segment's end / before its start; ``sync``: lane
    ``arg`` of the segment (modulo ``width``)."""
    what = f"T.shfl_{mode}"
    if not isinstance(width, int) or isinstance(width, bool) or width not in (1, 2, 4, 8, 16, 32):
        raise semantic.err(f"{what}: width must be a power of two from 1 to 32 known at build "
                           f"time, got {width!r}")
    if ir.as_int(to_expr(mask, ir.DType.U32)) != 0xFFFFFFFF:
        raise semantic.err(f"{what}: only the full-warp mask 0xFFFFFFFF is supported (every lane "
                           f"takes part)")
    indices, counts = _threads(what)
    lin = _linear(indices, counts)
    value = to_expr(value, None)
    arg = semantic.cast(arg, _I32)
    frag = _publish(Scalar(value), value.dtype, counts, indices, f"shfl_{mode}")
    lane = lin % width if mode != "xor" else lin % WARP
    if mode == "xor":
        partner = lane ^ arg
        src = semantic.select(partner < (lane // width + 1) * width, lin - lane + partner, lin)
    elif mode == "down":
        src = semantic.select(lane + arg < width, lin + arg, lin)
    elif mode == "up":
        src = semantic.select(lane - arg >= 0, lin - arg, lin)
    else:
        src = lin - lane + arg % width
    return _read_back(frag, _unlinear(src, counts), f"shfl_{mode}_out")


def dp4a(a, b, c) -> None:
    """``T.dp4a(A[i], B[j], C[k])``: ``C[k] += A[i+0]*B[j+0] + ... + A[i+3]*B[j+3]``, the four
    products of int8 elements summed in int32."""
    refs = (a, b, c)
    if not all(isinstance(r, ElementRef) for r in refs):
        raise semantic.err("T.dp4a(A[i], B[j], C[k]) takes three buffer elements")
    wanted = (ir.DType.I8, ir.DType.I8, ir.DType.I32)
    for r, name, dt in zip(refs, "ABC", wanted):
        if r.buffer.dtype is not dt:
            raise semantic.err(f"T.dp4a: {name} ('{r.buffer.name}') must be {dt.value}, got "
                               f"{r.buffer.dtype.value}")
    total: Optional[Scalar] = None
    for k in range(4):
        x, y = (BufferRef(r.buffer)[r.indices[:-1] + (Scalar(r.indices[-1]) + k,)] for r in (a, b))
        term = semantic.cast(x, _I32) * semantic.cast(y, _I32)
        total = term if total is None else total + term
    semantic.store(c, c + total)


__all__ = ["Allreduced", "CommReducer", "NullHandle", "ReduceScopeFrame",
           "comm_reducer", "dp4a", "null_handle", "shuffle", "thread_allreduce", "warp_reduce"]
