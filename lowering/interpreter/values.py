"""Element types on the CPU: the numpy dtype of each ``ir.DType`` and how values are rounded.

Contract:
* ``storage(dt)`` is the numpy dtype that holds ``dt`` bit-exactly (ml_dtypes for bf16 and fp8).
* Values being computed with are held in a *value dtype* (``Numerics.value``): float64 for f64,
  float32 for the other floats (every bf16/f16/fp8 number is exactly an f32), int64 for integers,
  bool for bool. In wide mode (``run(accumulate_f64=True)``) every float value is float64.
* ``Numerics.round(x, dt)`` ends every operation of dtype ``dt``: floats are rounded to nearest
  even (not at all in wide mode), integers wrap (two's complement). ``Numerics.cast`` is an
  explicit ``T.cast``: float -> int truncates, -> bool tests != 0, and a cast to a 16/8-bit float
  rounds even in wide mode. Conversions to f8e4m3 saturate to +-448, as torch's do; NaN converted to f8e5m2 is
  torch's (0x7F with its sign).
* ``Numerics.held(buffer)`` is the dtype a buffer's elements are stored in: its storage dtype,
  except float fragments and locals in wide mode, which are float64.
* ``poison(dtype)`` is the value fresh on-chip memory holds (NaN for floats).
"""
from __future__ import annotations

import numpy as np

from .. import ir

_E4M3_MAX = 448.0
F64 = np.dtype(np.float64)
F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def storage(dt: ir.DType) -> np.dtype:
    return dt.numpy_dtype


def poison(dtype: np.dtype):
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return True if dtype == BOOL else np.nan


def to_storage(x, dtype: np.dtype) -> np.ndarray:
    """``x`` converted to the numpy ``dtype`` a buffer is held in (rounding, saturating fp8)."""
    x = np.asarray(x)
    if dtype == ir.DType.F8E4M3.numpy_dtype:
        x = np.clip(x.astype(F32), -_E4M3_MAX, _E4M3_MAX)
    y = x.astype(dtype)
    if dtype == ir.DType.F8E5M2.numpy_dtype:    # NaN as torch's (ml_dtypes: 0x7E)
        y = np.where(np.isnan(x), np.where(np.signbit(x), 0xFF, 0x7F).astype(np.uint8),
                     y.view(np.uint8)).view(dtype)
    return y


class Numerics:
    """The value dtypes and roundings of one run (``wide``: float64 on chip)."""

    def __init__(self, wide: bool):
        self.wide = wide

    def value(self, dt: ir.DType) -> np.dtype:
        if dt.is_float:
            return F64 if self.wide or dt is ir.DType.F64 else F32
        return BOOL if dt is ir.DType.BOOL else I64

    def held(self, buf: ir.Buffer) -> np.dtype:
        if self.wide and buf.dtype.is_float and buf.scope in (ir.Scope.FRAGMENT, ir.Scope.LOCAL):
            return F64
        return storage(buf.dtype)

    def round(self, x, dt: ir.DType) -> np.ndarray:
        x = np.asarray(x)
        if dt.is_float:
            if self.wide or dt in (ir.DType.F64, ir.DType.F32):
                return x.astype(self.value(dt))
            return to_storage(x, storage(dt)).astype(F32)
        if dt is ir.DType.BOOL:
            return x.astype(BOOL)
        x = x.astype(I64)
        return x if dt is ir.DType.I64 else x.astype(storage(dt)).astype(I64)

    def cast(self, x, dt: ir.DType) -> np.ndarray:
        if dt is ir.DType.BOOL:
            return np.asarray(x) != 0
        if self.wide and dt.is_float and dt.bits < 32:
            return to_storage(x, storage(dt)).astype(F64)
        return self.round(x, dt)
