"""Values a kernel body computes with at build time.

Python ints, floats and bools stay Python values. Anything that depends on a runtime quantity (a
block index, a loop index, a runtime dim, a buffer element) is a ``Scalar`` wrapping an
``ir.Expr``; its operators build IR (folded by ``simplify.fold_binop``). Buffers are ``BufferRef``;
indexing one gives an ``ElementRef`` (all indices scalar: an element, or a region start in
``T.copy``) or a ``RegionRef`` (some index is a slice).
"""
from __future__ import annotations

import math
from typing import Union

from .. import dtypes, ir
from ..errors import CompileError
from ..simplify import difference, fold_binop
from .context import current_loc, user_loc

PyNum = Union[int, float, bool]

_FLOAT_RANK = {ir.DType.F8E5M2: 0, ir.DType.F8E4M3: 0, ir.DType.BF16: 1, ir.DType.F16: 1,
               ir.DType.F32: 2, ir.DType.F64: 3}
_INT_RANK = {ir.DType.BOOL: 0, ir.DType.I8: 1, ir.DType.U8: 1, ir.DType.I16: 2, ir.DType.U16: 2,
             ir.DType.I32: 3, ir.DType.U32: 3, ir.DType.I64: 4, ir.DType.U64: 4}


def promote(a: ir.DType, b: ir.DType) -> ir.DType:
    """The result type of a binary operation on two typed operands."""
    if a == b:
        return a
    if a.is_float and b.is_float:
        if _FLOAT_RANK[a] == _FLOAT_RANK[b]:   # bf16 with f16: no common 16-bit type
            return ir.DType.F32
        return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    return a if _INT_RANK[a] >= _INT_RANK[b] else b


def to_expr(v, like: ir.DType | None = None) -> ir.Expr:
    """An IR expression for a build-time value; Python literals take ``like``'s type where they
    fit it (weak typing, as in Triton and TileLang)."""
    if isinstance(v, Scalar):
        return v.expr
    if isinstance(v, ir.Expr):
        return v
    if isinstance(v, BufferRef):
        raise CompileError(f"buffer '{v.buffer.name}' used where a scalar is expected; index it",
                           current_loc())
    if isinstance(v, bool):
        return ir.Const(v, ir.DType.BOOL, current_loc())
    if isinstance(v, int):
        if like is not None and (like.is_float or like.is_int and like.wrap(v) == v):
            return ir.Const(float(v) if like.is_float else v, like, current_loc())
        return ir.Const(v, ir.DType.I32 if -2**31 <= v < 2**31 else ir.DType.I64, current_loc())
    if isinstance(v, float):
        dt = like if like is not None and like.is_float else ir.DType.F32
        return ir.Const(v, dt, current_loc())
    raise CompileError(f"cannot use a value of type {type(v).__name__} in a kernel expression",
                       current_loc())


def _dtype_of(v) -> ir.DType | None:
    if isinstance(v, Scalar):
        return v.expr.dtype
    return None


def binary(op: ir.BinOpKind, x, y) -> "Scalar":
    dx, dy = _dtype_of(x), _dtype_of(y)
    a = to_expr(x, dy)
    b = to_expr(y, dx)
    if op in (ir.BinOpKind.LAND, ir.BinOpKind.LOR):
        dt = ir.DType.BOOL
    elif op is ir.BinOpKind.DIV:
        dt = promote(a.dtype, b.dtype)
        if not dt.is_float:
            dt = ir.DType.F32
    else:
        dt = promote(a.dtype, b.dtype)
        if op in (ir.BinOpKind.AND, ir.BinOpKind.OR, ir.BinOpKind.XOR, ir.BinOpKind.SHL,
                  ir.BinOpKind.SHR) and dt.is_float:
            raise CompileError(f"operator '{op.value}' needs integer operands, got {dt.value}",
                               current_loc())
    folded = fold_binop(op, a, b, dt, current_loc())
    return Scalar(folded if folded is not None else ir.BinOp(op, a, b, dt, current_loc()))


def compare(op: ir.CmpKind, x, y) -> "Scalar":
    a = to_expr(x, _dtype_of(y))
    b = to_expr(y, _dtype_of(x))
    return Scalar(ir.Cmp(op, a, b, current_loc()))


class Scalar:
    """A runtime scalar (or per-element value inside ``T.Parallel``)."""
    __slots__ = ("expr",)

    def __init__(self, expr: ir.Expr):
        self.expr = expr

    @property
    def dtype(self) -> ir.DType:
        return self.expr.dtype

    def __bool__(self):
        raise CompileError("a runtime value cannot be used as a Python bool (it is only known when "
                           "the kernel runs); use an `if` on it directly or T.if_then_else",
                           current_loc())

    def __index__(self):
        raise CompileError("a runtime value cannot be used where a build-time integer is needed "
                           "(shapes, extents and Python ranges must be known at build time)",
                           current_loc())

    def __repr__(self) -> str:
        from ..printer import expr
        return f"Scalar({expr(self.expr)})"

    def astype(self, dtype) -> "Scalar":
        """``T.cast(self, dtype)`` (TileLang's method spelling)."""
        return cast(self, dtype)

    # arithmetic -------------------------------------------------------------------------------
    def __add__(self, o): return binary(ir.BinOpKind.ADD, self, o)
    def __radd__(self, o): return binary(ir.BinOpKind.ADD, o, self)
    def __sub__(self, o): return binary(ir.BinOpKind.SUB, self, o)
    def __rsub__(self, o): return binary(ir.BinOpKind.SUB, o, self)
    def __mul__(self, o): return binary(ir.BinOpKind.MUL, self, o)
    def __rmul__(self, o): return binary(ir.BinOpKind.MUL, o, self)
    def __truediv__(self, o): return binary(ir.BinOpKind.DIV, self, o)
    def __rtruediv__(self, o): return binary(ir.BinOpKind.DIV, o, self)
    def __floordiv__(self, o): return binary(ir.BinOpKind.FLOORDIV, self, o)
    def __rfloordiv__(self, o): return binary(ir.BinOpKind.FLOORDIV, o, self)
    def __mod__(self, o): return binary(ir.BinOpKind.MOD, self, o)
    def __rmod__(self, o): return binary(ir.BinOpKind.MOD, o, self)
    def __and__(self, o): return binary(ir.BinOpKind.AND, self, o)
    def __rand__(self, o): return binary(ir.BinOpKind.AND, o, self)
    def __or__(self, o): return binary(ir.BinOpKind.OR, self, o)
    def __ror__(self, o): return binary(ir.BinOpKind.OR, o, self)
    def __xor__(self, o): return binary(ir.BinOpKind.XOR, self, o)
    def __rxor__(self, o): return binary(ir.BinOpKind.XOR, o, self)
    def __lshift__(self, o): return binary(ir.BinOpKind.SHL, self, o)
    def __rlshift__(self, o): return binary(ir.BinOpKind.SHL, o, self)
    def __rshift__(self, o): return binary(ir.BinOpKind.SHR, self, o)
    def __rrshift__(self, o): return binary(ir.BinOpKind.SHR, o, self)

    def __neg__(self):
        return Scalar(ir.UnOp(ir.UnOpKind.NEG, self.expr, self.dtype, current_loc()))

    def __invert__(self):
        return Scalar(ir.UnOp(ir.UnOpKind.INVERT, self.expr, self.dtype, current_loc()))

    def __pos__(self):
        return self

    def __lt__(self, o): return compare(ir.CmpKind.LT, self, o)
    def __le__(self, o): return compare(ir.CmpKind.LE, self, o)
    def __gt__(self, o): return compare(ir.CmpKind.GT, self, o)
    def __ge__(self, o): return compare(ir.CmpKind.GE, self, o)
    def __eq__(self, o): return compare(ir.CmpKind.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return compare(ir.CmpKind.NE, self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]


def logical_not(x) -> Union[Scalar, bool]:
    if not isinstance(x, Scalar):
        return not x
    return Scalar(ir.UnOp(ir.UnOpKind.NOT, x.expr, ir.DType.BOOL, current_loc()))


class BufferRef:
    """A buffer as the kernel body sees it."""
    __slots__ = ("buffer",)

    def __init__(self, buffer: ir.Buffer):
        self.buffer = buffer

    @property
    def shape(self) -> tuple:
        return tuple(ir.as_int(d) if ir.as_int(d) is not None else Scalar(d) for d in self.buffer.shape)

    @property
    def dtype(self) -> ir.DType:
        return self.buffer.dtype

    def __repr__(self) -> str:
        return f"BufferRef({self.buffer.name})"

    def __getitem__(self, index) -> Union["ElementRef", "RegionRef"]:
        idx = index if isinstance(index, tuple) else (index,)
        b = self.buffer
        if len(idx) != len(b.shape):
            raise CompileError(f"'{b.name}' has {len(b.shape)} dimensions but is indexed with "
                               f"{len(idx)}", current_loc())
        if not any(isinstance(i, slice) for i in idx):
            return ElementRef(b, tuple(to_expr(i, ir.DType.I32) for i in idx))
        starts, extents = [], []
        for d, (i, dim) in enumerate(zip(idx, b.shape)):
            if isinstance(i, slice):
                if i.step not in (None, 1):
                    raise CompileError(f"slices with a step are not supported (dimension {d} of "
                                       f"'{b.name}')", current_loc())
                start = 0 if i.start is None else i.start
                stop = dim if i.stop is None else to_expr(i.stop)
                ext = _static_extent(start, stop)
                if ext is None:
                    from ..printer import expr
                    raise CompileError(f"slice {expr(to_expr(start))}:{expr(stop)} of dimension "
                                       f"{d} of '{b.name}' has an extent (stop - start) that is not "
                                       f"a build-time constant", current_loc(),
                                       ["write A[i:i + n] or A[k * n:(k + 1) * n] with n a "
                                        "constant"])
                if ext <= 0:
                    raise CompileError(f"slice of dimension {d} of '{b.name}' has extent {ext}; "
                                       f"it must be positive", current_loc())
                starts.append(to_expr(start, ir.DType.I32))
                extents.append(ext)
            else:
                starts.append(to_expr(i, ir.DType.I32))
                extents.append(1)
        return RegionRef(ir.Region(b, tuple(starts), tuple(extents), current_loc()))

    def __setitem__(self, index, value):
        raise CompileError("internal: stores are handled by the frontend", current_loc())


def _static_extent(start, stop) -> int | None:
    """stop - start as an int when it does not depend on runtime values."""
    end = to_expr(stop) if not isinstance(stop, ir.Expr) else stop
    return difference(end, to_expr(start))


class ElementRef(Scalar):
    """``buf[i, j]`` with scalar indices: an element load, or a region start in ``T.copy``."""
    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: ir.Buffer, indices: tuple):
        super().__init__(ir.Load(buffer, indices, current_loc()))
        self.buffer = buffer
        self.indices = indices


class VarRef(ElementRef):
    """The scalar of ``T.alloc_var``: a one-element local buffer read wherever the name is used
    (each use loads its value then). The frontend stores into it where the name is assigned
    (``v = e``, ``v += 1``); ``v[0]`` is the element as well."""
    __slots__ = ()

    def __init__(self, buffer: ir.Buffer):
        self.buffer = buffer
        self.indices = (ir.Const(0, ir.DType.I32, buffer.loc),)

    @property
    def expr(self) -> ir.Expr:
        return ir.Load(self.buffer, self.indices, current_loc())

    def __getitem__(self, index) -> "ElementRef":
        return BufferRef(self.buffer)[index]

    def __repr__(self) -> str:
        return f"VarRef({self.buffer.name})"


class NewVar(VarRef):
    """What ``T.alloc_var`` returns: assigning it binds the name to the variable (every other
    assignment to a variable's name stores into it)."""
    __slots__ = ()


class RegionRef:
    """``buf[a:b, ...]``: a box of a buffer."""
    __slots__ = ("region",)

    def __init__(self, region: ir.Region):
        self.region = region

    def __repr__(self) -> str:
        from ..printer import region
        return f"RegionRef({region(self.region)})"


def ceildiv(a, b):
    if isinstance(a, Scalar) or isinstance(b, Scalar):
        return (a + b - 1) // b
    return -(-a // b)


# ----------------------------------------------------------------------------------------------
# dtypes


def as_dtype(x) -> ir.DType:
    """A DType from anything ``T.dtype`` accepts (a DType, a TileLang/numpy name, a torch or numpy
    dtype, ``bool``/``int``/``float``)."""
    if isinstance(x, ir.DType):
        return x
    try:
        return ir.DType(x)
    except ValueError as e:
        raise CompileError(str(e), user_loc()) from None


def cast(x, dtype) -> Scalar:
    """``x`` as ``dtype``: a Python number becomes a constant of that type (converted as a C cast
    would: float -> int truncates), a runtime value is converted. Also what calling a dtype does
    (``T.float16(x)``: ``dtypes.DType.__call__``)."""
    dt = as_dtype(dtype)
    if isinstance(x, (bool, int, float)):
        return Scalar(ir.Const(_number_as(x, dt), dt, current_loc()))
    e = to_expr(x, None)
    if e.dtype == dt:
        return Scalar(e)
    return Scalar(ir.Cast(e, dt, current_loc()))


def bitcast(x, dtype) -> Scalar:
    """``x``'s bits read as ``dtype`` (``T.reinterpret``); the widths must match."""
    dt = as_dtype(dtype)
    e = to_expr(x, None)
    if e.dtype.bits != dt.bits or ir.DType.BOOL in (dt, e.dtype):
        raise CompileError(f"T.reinterpret: {e.dtype} ({e.dtype.bits} bits) cannot be reinterpreted "
                           f"as {dt} ({dt.bits} bits); a bit-cast keeps the width (T.cast converts "
                           f"the value)", current_loc())
    return Scalar(e if e.dtype == dt else ir.Bitcast(e, dt, current_loc()))


def _number_as(x, dt: ir.DType):
    if dt.is_float:
        return float(x)
    if dt is ir.DType.BOOL:
        return bool(x)
    if isinstance(x, float) and not math.isfinite(x):
        raise CompileError(f"{x} has no {dt} value", current_loc())
    v = int(x)
    lo, hi = (0, 2 ** dt.bits) if dt.record.kind == "uint" else (-2 ** (dt.bits - 1), 2 ** (dt.bits - 1))
    if not lo <= v < hi:
        raise CompileError(f"{x} is out of range for {dt} [{lo}, {hi - 1}]", current_loc())
    return v


dtypes.register_cast(cast)   # what a dtype called in a kernel does (DType.__call__)
