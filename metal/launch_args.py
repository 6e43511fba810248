"""What every Metal launcher checks and computes from an ``MslKernel``'s launch: the element dtype of
a parameter, the value of a scalar parameter, and the dispatch sizes of a grid of threadgroups.

Errors name the kernel parameter (``ValueError``/``TypeError``), so a wrong argument to a launch is
reported the same way by every runtime (mlx, torch.mps).
"""
from __future__ import annotations

import numbers
from typing import Sequence

from tilews.lowering.dtypes import DType

from .source import MslKernel, MslParam


def element_dtype(param: MslParam) -> DType:
    """The tilews dtype a buffer of ``param.dtype`` holds: the one whose MSL spelling it is (for
    ``uchar``, ``u8``: fp8 data is stored as ``uchar`` too; see ``storage_dtypes``)."""
    found = next((d for d in DType if d.record.msl == param.dtype and not d.is_fp8), None)
    if found is None:
        raise ValueError(f"kernel parameter '{param.name}': no tilews dtype is spelled "
                         f"{param.dtype!r} in MSL")
    return found


def storage_dtypes(param: MslParam) -> tuple[DType, ...]:
    """Every tilews dtype whose data may fill a buffer of ``param.dtype`` (``uchar``: u8 and the
    fp8 dtypes)."""
    return tuple(d for d in DType if d.record.msl == param.dtype)


def scalar_value(param: MslParam, value) -> int | float:
    """``value`` as the Python number a runtime passes for the scalar ``param``: a float for a
    float dtype, an int (range-checked) for an integer or bool dtype."""
    if not isinstance(value, numbers.Real):
        raise TypeError(f"kernel parameter '{param.name}' is a {param.dtype} scalar: pass a Python "
                        f"number, not {type(value).__name__}")
    dtype = element_dtype(param)
    if dtype.is_float:
        return float(value)
    if dtype == DType.BOOL:
        return int(bool(value))
    if not isinstance(value, numbers.Integral) and not float(value).is_integer():
        raise ValueError(f"kernel parameter '{param.name}' is a {param.dtype} scalar: {value!r} "
                         f"is not an integer")
    signed = dtype.record.kind == "int"
    low, high = (-(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1) if signed else (0, (1 << dtype.bits) - 1)
    if not low <= int(value) <= high:
        raise ValueError(f"kernel parameter '{param.name}' is a {param.dtype} scalar: {value!r} is "
                         f"outside [{low}, {high}]")
    return int(value)


def dispatch(kernel: MslKernel, grid: Sequence[int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(threads in the grid, threads per threadgroup) for a grid of ``grid = (gx, gy, gz)``
    threadgroups of ``kernel.threads`` threads each (1-D threadgroups): Metal's dispatchThreads,
    which mlx and torch.mps both call, counts threads, not threadgroups."""
    if len(grid) != 3 or not all(isinstance(g, numbers.Integral) and g >= 1 for g in grid):
        raise ValueError(f"kernel {kernel.name}: the grid is three positive threadgroup counts "
                         f"(gx, gy, gz); got {tuple(grid)!r}")
    gx, gy, gz = (int(g) for g in grid)
    return (gx * kernel.threads, gy, gz), (kernel.threads, 1, 1)
