"""``T.make_tensor``: a global tensor at a device address the kernel reads at run time.

The address is a 64-bit integer value (an element of a pointer table: an int64 tensor parameter
declared ``T.Tensor([n], T.ptr)``, filled with ``t.data_ptr()`` of each tensor). The view's shape
and dtype are the program's claim about that memory; accesses are masked against that shape as
for any global tensor. One ``ir.PointerView`` statement binds the view where it is made.
"""
from __future__ import annotations

from typing import Optional

from .. import ir
from .context import builder, current_loc
from .semantic import err
from .values import BufferRef, Scalar, as_dtype, to_expr

_ADDRESS_DTYPES = (ir.DType.I64, ir.DType.U64)


def make_tensor(address, shape, dtype, strides, name: Optional[str]) -> BufferRef:
    b = builder()
    if b.parallel_vars:
        raise err("T.make_tensor cannot be used inside T.Parallel (one view per block or loop "
                  "iteration: make it before the parallel loop)")
    addr = _address(address)
    dims = _dims(shape, "shape")
    if dtype is None:
        raise err("T.make_tensor(address, shape, dtype): dtype is missing; give the element type "
                  "of the memory at the address (a wrong one reads it wrongly)")
    dt = as_dtype(dtype)
    if strides is None:
        steps = _row_major(dims)
    else:
        steps = _dims(strides, "strides")
        if len(steps) != len(dims):
            raise err(f"T.make_tensor: strides has {len(steps)} entries but shape has {len(dims)} "
                      f"dimensions")
    loc = current_loc()
    buf = ir.Buffer(b.unique(name or "tensor"), dims, dt, ir.Scope.GLOBAL, (), loc)
    b.emit(ir.PointerView(buf, addr, steps, loc))
    return BufferRef(buf)


def _address(address) -> ir.Expr:
    if isinstance(address, BufferRef):
        raise err(f"T.make_tensor: address is the whole tensor '{address.buffer.name}'; pass one "
                  f"of its elements (a pointer table entry such as {address.buffer.name}[i])")
    if not isinstance(address, Scalar):
        raise err(f"T.make_tensor: address must be a device address read in the kernel (an "
                  f"element of a T.Tensor([n], T.ptr) pointer table), got "
                  f"{type(address).__name__} {address!r}")
    if address.dtype not in _ADDRESS_DTYPES:
        raise err(f"T.make_tensor: address has dtype {address.dtype}, not a pointer; declare the "
                  f"pointer table T.Tensor([n], T.ptr) (64-bit addresses)")
    return address.expr


def _dims(values, what: str) -> tuple[ir.Expr, ...]:
    """Positive build-time ints or runtime integer values (a tuple; one int is one dim)."""
    items = (values,) if isinstance(values, (int, Scalar)) else values
    if not isinstance(items, (tuple, list)) or not items:
        raise err(f"T.make_tensor: {what} must be a non-empty tuple of positive ints or runtime "
                  f"integers, got {values!r}")
    out = []
    for d, v in enumerate(items):
        if isinstance(v, Scalar) and v.dtype.is_int:
            out.append(v.expr)
        elif isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out.append(to_expr(v))
        else:
            raise err(f"T.make_tensor: {what}[{d}] is {v!r}; each entry must be a positive int or "
                      f"a runtime integer")
    return tuple(out)


def _row_major(dims: tuple[ir.Expr, ...]) -> tuple[ir.Expr, ...]:
    step: object = 1
    out = []
    for d in reversed(dims):
        out.append(to_expr(step))
        n = ir.as_int(d)
        step = step * n if n is not None else Scalar(d) * step
    return tuple(reversed(out))
