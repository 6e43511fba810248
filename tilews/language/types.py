"""Data types and parameter annotations: ``T.float16``, ``T.Tensor((M, K), dtype)``, ``T.dynamic``."""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.frontend import context, semantic

DType = ir.DType
dtype = ir.DType   # T.dtype(x): the DType of a name, torch/numpy dtype or bool/int/float
bfloat16 = ir.DType.BF16
float16 = ir.DType.F16
half = ir.DType.F16
float32 = ir.DType.F32
float64 = ir.DType.F64
int8 = ir.DType.I8
int16 = ir.DType.I16
int32 = ir.DType.I32
int64 = ir.DType.I64
uint8 = ir.DType.U8
uint16 = ir.DType.U16
uint32 = ir.DType.U32
uint64 = ir.DType.U64
boolean = ir.DType.BOOL
float8_e4m3 = ir.DType.F8E4M3
float8_e4m3fn = ir.DType.F8E4M3
float8_e5m2 = ir.DType.F8E5M2


def dynamic(name: str):
    """A tensor dimension known only at run time: it is passed to the kernel and never triggers a
    recompilation. In an annotation it declares the dimension; inside a kernel body it is that
    dimension's runtime value."""
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"T.dynamic takes an identifier, got {name!r}")
    if context.building():
        return semantic.scalar_param(name)
    return semantic.Dynamic(name)


class _TensorMeta(type):
    def __getitem__(cls, item):
        shape, dtype = item
        return cls(shape, dtype)


class Tensor(metaclass=_TensorMeta):
    """Annotation of a tensor parameter: ``T.Tensor((M, K), T.float16)`` or
    ``T.Tensor[(M, K), "float16"]``; a shape that is no tuple or list is one dimension
    (``T.Tensor[(batch), T.int32]``). Dims are ints, ``T.dynamic(name)``, or (direct style) names
    bound from the argument's shape."""

    def __new__(cls, shape, dtype):
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        return semantic.TensorSpec(shape, semantic.as_dtype(dtype))


Buffer = Tensor
