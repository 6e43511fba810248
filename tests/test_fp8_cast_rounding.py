"""Casts into FP8 on the CPU-runnable targets (docs/design.md, numeric contract): float32 and
float16 values converted to ``float8_e4m3fn`` / ``float8_e5m2`` (a store, ``T.cast`` and a
``T.copy`` into a global FP8 buffer) are bit-equal to torch's ``.to(...)``: round to nearest
even, subnormals included; e4m3fn saturates to +-448 (infinity too), e5m2 overflows to infinity;
NaN keeps its sign. Before, Triton 3.6's CPU interpreter lost the carry of a rounding that
overflows the mantissa (7.9 -> 4.0) and mishandled ties and subnormals.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import poisoned, randn

N, BLOCK = 4096, 1024
FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def cast_kernel(dtype, src_dtype):
    @T.prim_func
    def main(X: T.Tensor((N,), src_dtype), Stored: T.Tensor((N,), dtype),
             Cast: T.Tensor((N,), dtype), Copied: T.Tensor((N,), dtype)):
        with T.Kernel(N // BLOCK, threads=128) as bx:
            tile = T.alloc_fragment((BLOCK,), src_dtype)
            T.copy(X[bx * BLOCK], tile)
            for i in T.Parallel(BLOCK):
                Stored[bx * BLOCK + i] = X[bx * BLOCK + i]
                Cast[bx * BLOCK + i] = T.cast(tile[i] * 1.0, dtype)
            T.copy(tile, Copied[bx * BLOCK])
    return main


def hard_values(dt: torch.dtype) -> torch.Tensor:
    """Float32 values where rounding into ``dt`` is hard: every midpoint of two neighbouring
    codes (ties, the subnormal ones too) and a float32 ulp either side, the largest finite code
    and beyond, infinities, NaN, zeros, float32 subnormals."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(dt).float()   # positive codes
    finite = codes[torch.isfinite(codes)]
    mids = (finite[1:] + finite[:-1]) / 2
    near = torch.cat([mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(1e9))])
    top = finite.max().item()
    special = torch.tensor([top, top * 1.0625, top * 1.125, top * 2, 1e30, float("inf"),
                            float("nan"), 0.0, 1e-40, 1e-45])
    values = torch.cat([near, finite, special])
    return torch.cat([values, -values])


def inputs(dt: torch.dtype, src: torch.dtype) -> torch.Tensor:
    """``N`` values: the hard ones, the rest normal times 2**k for k across the subnormal range
    to overflow, in ``src`` (its own rounding first)."""
    hard = hard_values(dt)
    k = torch.randint(-22, 18, (N - len(hard),), generator=torch.Generator().manual_seed(11))
    x = torch.cat([hard, randn(N - len(hard), seed=12) * torch.exp2(k.float())])
    return x.to(src)


@pytest.mark.parametrize("src", ["float32", "float16"])
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_casts_into_fp8_match_torch_bitwise(target, dtype, src):
    dt, src_dt = FP8[dtype], {"float32": torch.float32, "float16": torch.float16}[src]
    x = inputs(dt, src_dt)
    outs = [poisoned(N, dtype=dt) for _ in range(3)]
    tilews.jit(target=target)(cast_kernel)(dtype, src)(x, *outs)
    want = x.to(dt).view(torch.uint8)
    for name, got in zip(("store", "T.cast", "T.copy"), outs):
        bad = got.view(torch.uint8) != want
        assert not bad.any(), f"{name}: {int(bad.sum())} of {N} differ, e.g. " \
                              f"{x[bad][:4].tolist()} -> {got[bad][:4].float().tolist()}"
