"""Arrival counters for kernels whose blocks count themselves in global memory and put every
count back to zero before they finish (``gemm_programs.split_k_fused``).

``arrival_counters(device, count)``: a zeroed int32 tensor of at least ``count`` counters, one per
device and CUDA stream (kernels on one stream run one after another, so they can share it; kernels
on two streams may overlap, so they never share one), grown when a launch needs more. A CUDA graph
captured on a stream keeps the counters of that stream, which stay zero between replays."""
from __future__ import annotations

import torch

from tilews.binding import stream_key

MIN_COUNTERS = 1024
_counters: dict[tuple, torch.Tensor] = {}


def arrival_counters(device: torch.device, count: int) -> torch.Tensor:
    key = stream_key(device)     # the stream's raw handle: no torch.cuda.Stream object per call
    counters = _counters.get(key)
    if counters is None or counters.numel() < count:
        size = max(count, MIN_COUNTERS, 2 * (0 if counters is None else counters.numel()))
        counters = _counters[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return counters
