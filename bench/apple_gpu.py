"""The bench on a Mac's GPU: the GEMM baselines of tilews's metal target, ``mlx.core.matmul``
(mlx's steel GEMM) and ``torch.mm`` on the MPS device, and tilews's metal kernels run there.

The bench hands every kernel CPU tensors, the same objects on every call; each of these copies a
tensor to its device the first time it sees it and reuses that copy, so the timed calls run the
kernel only, plus what returning the result takes: for mlx nothing (the evaluated array's memory,
unified with the CPU's, becomes the returned tensor), for torch.mm and tilews one copy of the
result to the CPU (``rel_err`` cannot read an MPS tensor: MPS has no float64). All wait for the GPU.

mlx is imported when a baseline is built, never at import (it is absent from most machines).
"""
from __future__ import annotations

from typing import Callable

import torch

from tilews.lowering.dtypes import from_torch

from .workload import Case, KernelFn

DEVICE = "mps"   # where torch.mm and tilews's metal kernels run


class DeviceCopies:
    """``copies(t)``: ``convert(t)`` made once per input tensor (kept alive with it, so its id is
    not reused)."""

    def __init__(self, convert: Callable[[torch.Tensor], object]):
        self.convert = convert
        self.made: dict[int, tuple[torch.Tensor, object]] = {}

    def __call__(self, t: torch.Tensor):
        if id(t) not in self.made:
            self.made[id(t)] = (t, self.convert(t))
        return self.made[id(t)][1]


def mlx_matmul(case: Case) -> KernelFn:
    """``mx.matmul`` in the case's dtype; returns the product as a torch tensor sharing its memory."""
    import mlx.core as mx
    import numpy as np
    dtype = getattr(mx, from_torch(case.dtype).record.torch)      # mx.bfloat16, mx.float16
    arrays = DeviceCopies(lambda t: mx.array(t.float().numpy()).astype(dtype))

    def call(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        product = mx.matmul(arrays(a), arrays(b))
        mx.eval(product)
        # numpy has no bfloat16: the 16-bit patterns travel as int16 and are reinterpreted
        return torch.from_numpy(np.asarray(product.view(mx.int16))).view(case.dtype)
    return call


def mps_mm(case: Case) -> KernelFn:
    """``torch.mm`` on the MPS device; returns the product copied to the CPU."""
    tensors = DeviceCopies(lambda t: t.to(DEVICE))

    def call(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.mm(tensors(a), tensors(b)).cpu()
    return call


def on_mps(kernel: KernelFn) -> KernelFn:
    """A tilews metal kernel (it runs where its tensors are: MPS tensors on the GPU) called on MPS
    copies of the bench's tensors, its output's included; returns that output copied to the CPU."""
    tensors = DeviceCopies(lambda t: t.to(DEVICE))

    def call(*args) -> torch.Tensor:
        *inputs, out = args
        on_device = tensors(out)
        kernel(*(tensors(a) if isinstance(a, torch.Tensor) else a for a in inputs), on_device)
        return on_device.cpu()
    call.note = getattr(kernel, "note", "")
    return call
