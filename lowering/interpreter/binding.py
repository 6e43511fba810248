"""Kernel arguments -> the interpreter's global memory and scalar environment.

Contract: ``bind(kernel, args, numerics)`` takes ``args`` already checked against
``kernel.params`` (``lowering.arguments.check``; ``interpreter.run`` checks them). It returns the
global arrays by buffer name, numpy views sharing the tensors' memory and strides (so results land
in the caller's tensors), the environment binding each scalar ``Var``, and a ``finish`` callable
that copies results back into tensors living off the CPU (those are run on CPU copies).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .. import dtypes, ir
from .values import Numerics, storage

# dtypes numpy cannot hold natively: viewed as integers of the same width, then as ml_dtypes
_BITS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def bind(kernel: ir.Kernel, args: list, numerics: Numerics):
    env = {p: numerics.round(a, p.dtype) for p, a in zip(kernel.params, args) if isinstance(p, ir.Var)}
    arrays: dict[str, np.ndarray] = {}
    copies: list[Callable[[], None]] = []
    for p, a in zip(kernel.params, args):
        if isinstance(p, ir.Buffer):
            arrays[p.name], copy_back = _view(a)
            if copy_back is not None:
                copies.append(copy_back)

    def finish() -> None:
        for copy_back in copies:
            copy_back()

    return arrays, env, finish


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
    return dtypes.from_torch(torch_dtype)
