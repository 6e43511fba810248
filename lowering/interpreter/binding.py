"""Kernel arguments -> the interpreter's global memory and scalar environment.

Contract: ``bind(kernel, args, numerics)`` checks ``args`` against ``kernel.params`` (count; a
torch tensor of the parameter's dtype and shape, runtime dims included, for each buffer; a number
for each scalar) and raises ``TypeError`` / ``ValueError`` naming the parameter. It returns the
global arrays by buffer name, numpy views sharing the tensors' memory and strides (so results land
in the caller's tensors), the environment binding each scalar ``Var``, and a ``finish`` callable
that copies results back into tensors living off the CPU (those are run on CPU copies).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .. import ir
from .expressions import Evaluator
from .values import Numerics, storage

_TORCH = {ir.DType.BF16: torch.bfloat16, ir.DType.F16: torch.float16, ir.DType.F32: torch.float32,
          ir.DType.F64: torch.float64, ir.DType.I8: torch.int8, ir.DType.I16: torch.int16,
          ir.DType.I32: torch.int32, ir.DType.I64: torch.int64, ir.DType.U8: torch.uint8,
          ir.DType.BOOL: torch.bool, ir.DType.F8E4M3: torch.float8_e4m3fn,
          ir.DType.F8E5M2: torch.float8_e5m2}
# dtypes numpy cannot hold natively: viewed as integers of the same width, then as ml_dtypes
_BITS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def bind(kernel: ir.Kernel, args: list, numerics: Numerics):
    if len(args) != len(kernel.params):
        names = ", ".join(p.name for p in kernel.params)
        raise TypeError(f"kernel '{kernel.name}' takes {len(kernel.params)} arguments ({names}), "
                        f"got {len(args)}")
    env: dict = {}
    for p, a in zip(kernel.params, args):
        if isinstance(p, ir.Var):
            if isinstance(a, bool) or not isinstance(a, (int, float, np.number)):
                raise TypeError(f"argument '{p.name}' must be a number, got {type(a).__name__}")
            env[p] = numerics.round(a, p.dtype)
    shapes = Evaluator(None, numerics)
    arrays: dict[str, np.ndarray] = {}
    copies: list[Callable[[], None]] = []
    for p, a in zip(kernel.params, args):
        if isinstance(p, ir.Buffer):
            _check_tensor(p, a, [shapes.index(d, env) for d in p.shape])
            arrays[p.name], copy_back = _view(a)
            if copy_back is not None:
                copies.append(copy_back)

    def finish() -> None:
        for copy_back in copies:
            copy_back()

    return arrays, env, finish


def _check_tensor(p: ir.Buffer, a, shape: list[int]) -> None:
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"argument '{p.name}' must be a torch tensor, got {type(a).__name__}")
    if a.dtype != _TORCH[p.dtype]:
        raise TypeError(f"argument '{p.name}' must have dtype {_TORCH[p.dtype]}, got {a.dtype}")
    if list(a.shape) != shape:
        raise ValueError(f"argument '{p.name}' must have shape {shape}, got {list(a.shape)}")


def _view(t: torch.Tensor):
    """(numpy view of ``t``'s memory, callable copying results back or None)."""
    host = t.detach()
    copy_back = None
    if host.device.type != "cpu":
        host = host.cpu()
        copy_back = lambda: t.data.copy_(host)  # noqa: E731
    if host.dtype in _BITS:
        array = host.view(_BITS[host.dtype]).numpy().view(storage(_dtype_of(host.dtype)))
    else:
        array = host.numpy()
    return array, copy_back


def _dtype_of(torch_dtype) -> ir.DType:
    return next(dt for dt, td in _TORCH.items() if td == torch_dtype)
