"""Checking and timing kernels: relative error, poisoned outputs, median milliseconds (used by the
examples, tests and benchmarks)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere in ``out`` (an unwritten, poisoned
    element) is an error, never a number."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if torch.isnan(o).any():
        raise AssertionError(f"output has {int(torch.isnan(o).sum())} NaN element(s): unwritten "
                             f"or poisoned")
    return ((o - r).norm() / r.norm().clamp_min(1e-300)).item()


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with NaN (floats) or a sentinel (integers) before a launch."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else -12345)


def time_ms(fn: Callable[[], object], device: torch.device, reps: int = 20) -> float:
    """Median milliseconds of ``fn``: CUDA events through ``triton.testing.do_bench`` on a GPU,
    wall clock elsewhere (interpreter timings: not comparable with GPU numbers)."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)

