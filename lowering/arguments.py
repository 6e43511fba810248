"""Kernel arguments against ``kernel.params``: one rule for every backend.

``check(kernel, args)`` takes ``args`` aligned with ``kernel.params`` — a torch tensor of the
parameter's dtype and shape (runtime dims included) for each buffer, a Python number of the right
kind for each scalar — and raises ``TypeError`` / ``ValueError`` naming the parameter. It returns
the runtime scalars by ``Var``.
"""
from __future__ import annotations

import torch

from . import ir

TORCH_DTYPES = {ir.DType.BF16: torch.bfloat16, ir.DType.F16: torch.float16,
                ir.DType.F32: torch.float32, ir.DType.F64: torch.float64, ir.DType.I8: torch.int8,
                ir.DType.I16: torch.int16, ir.DType.I32: torch.int32, ir.DType.I64: torch.int64,
                ir.DType.U8: torch.uint8, ir.DType.BOOL: torch.bool,
                ir.DType.F8E4M3: torch.float8_e4m3fn, ir.DType.F8E5M2: torch.float8_e5m2}


def check(kernel: ir.Kernel, args) -> dict[ir.Var, object]:
    params = kernel.params
    if len(args) != len(params):
        raise TypeError(f"kernel '{kernel.name}' takes {len(params)} arguments "
                        f"({', '.join(p.name for p in params)}), got {len(args)}")
    scalars = {}
    for p, a in zip(params, args):
        if isinstance(p, ir.Var):
            check_scalar(p, a)
            scalars[p] = a
    for p, a in zip(params, args):
        if isinstance(p, ir.Buffer):
            want = [scalars[d] if isinstance(d, ir.Var) else ir.as_int(d) for d in p.shape]
            check_tensor(p, a, want)
    return scalars


def check_scalar(p: ir.Var, a) -> None:
    if p.dtype is ir.DType.BOOL:
        ok, what = isinstance(a, bool), "a bool"
    elif p.dtype.is_float:
        ok, what = isinstance(a, (int, float)) and not isinstance(a, bool), "a number"
    else:
        ok, what = isinstance(a, int) and not isinstance(a, bool), "an int"
    if not ok:
        raise TypeError(f"argument '{p.name}' must be {what}, got {type(a).__name__}")


def check_tensor(p: ir.Buffer, a, shape: list) -> None:
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"argument '{p.name}' must be a torch tensor, got {type(a).__name__}")
    if a.dtype != TORCH_DTYPES[p.dtype]:
        raise TypeError(f"argument '{p.name}' must have dtype {TORCH_DTYPES[p.dtype]}, got {a.dtype}")
    if list(a.shape) != list(shape):
        raise ValueError(f"argument '{p.name}' must have shape {list(shape)}, got {list(a.shape)}")
