"""On a Mac: hand-written MSL kernels run on the Apple GPU through both launchers (mlx and
torch.mps) and match torch on the CPU. Skipped elsewhere (each launcher's tests skip on their own
when only one of mlx's Metal device and torch's MPS device is there).

The kernels: a bf16 scale with a half scalar and a bound check (``y = bfloat(x * alpha)``), an
in-place accumulate (torch.mps only: mlx cannot update in place), and the fp8 decode of
``tilews.metal.fp8_decode`` over every code, which also checks that text with Apple's compiler.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tilews.lowering.dtypes import DType
from tilews.metal.fp8_decode import FP8_DECODE_MSL, decoder
from tilews.metal.source import MslKernel, MslParam


def _mlx_metal():
    try:
        import mlx.core as mx
    except (ImportError, OSError):
        return None
    return mx if mx.metal.is_available() else None


mx = _mlx_metal()
MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
pytestmark = pytest.mark.skipif(mx is None and not MPS, reason="needs a Mac: neither mlx nor torch "
                                                               "has a Metal device here")
needs_mlx = pytest.mark.skipif(mx is None, reason="mlx has no Metal device here")
needs_mps = pytest.mark.skipif(not MPS, reason="torch has no MPS device here")

THREADS = 64
N = 1000   # not a multiple of THREADS: the last threadgroup's bound check matters


def scale_kernel() -> MslKernel:
    return MslKernel(
        name="tilews_test_scale", header="inline float scaled(float v, half s) { return v * float(s); }\n",
        body=(f"    uint i = threadgroup_position_in_grid.x * {THREADS} + thread_index_in_threadgroup;\n"
              "    if (i < n[0]) y[i] = bfloat(scaled(float(x[i]), alpha[0]));\n"),
        params=(MslParam("x", "bfloat", written=False), MslParam("alpha", "half", written=False, scalar=True),
                MslParam("n", "uint", written=False, scalar=True),
                MslParam("y", "bfloat", written=True, read=False)),
        attributes=("threadgroup_position_in_grid", "thread_index_in_threadgroup"), threads=THREADS)


def decode_kernel(dtype: DType) -> MslKernel:
    return MslKernel(
        name=f"tilews_test_decode_{dtype.value}", header=FP8_DECODE_MSL,
        body=("    uint i = threadgroup_position_in_grid.x * 32 + thread_index_in_simdgroup;\n"
              f"    out[i] = {decoder(dtype)}(codes[i]);\n"),
        params=(MslParam("codes", "uchar", written=False), MslParam("out", "half", written=True, read=False)),
        attributes=("threadgroup_position_in_grid", "thread_index_in_simdgroup"), threads=32)


def grid(n: int, threads: int) -> tuple[int, int, int]:
    return (-(-n // threads), 1, 1)


def scale_inputs():
    x = torch.randn(N, generator=torch.Generator().manual_seed(0)).bfloat16()
    alpha = 0.75
    return x, alpha, (x.float() * alpha).bfloat16()


def assert_decodes_like_torch(out: torch.Tensor, dtype: DType) -> None:
    want = torch.arange(256, dtype=torch.uint8).view(dtype.torch_dtype).to(torch.float16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


@needs_mps
def test_mps_scale_matches_torch():
    from tilews.metal.mps_launch import MpsLauncher
    x, alpha, want = scale_inputs()
    y = torch.full((N,), float("nan"), dtype=torch.bfloat16, device="mps")
    MpsLauncher(scale_kernel())([x.to("mps"), alpha, N, y], grid(N, THREADS))
    torch.mps.synchronize()
    torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)   # one rounding of the same product


@needs_mps
def test_mps_updates_in_place():
    from tilews.metal.mps_launch import MpsLauncher
    kernel = MslKernel("tilews_test_accumulate", "",
                       "    uint i = thread_index_in_threadgroup;\n    c[i] += a[i];\n",
                       (MslParam("a", "float", written=False), MslParam("c", "float", written=True)),
                       ("thread_index_in_threadgroup",), 256)
    a, c = torch.randn(256), torch.randn(256)
    c_mps = c.to("mps")
    MpsLauncher(kernel)([a.to("mps"), c_mps], (1, 1, 1))
    torch.mps.synchronize()
    torch.testing.assert_close(c_mps.cpu(), c + a)


@needs_mps
@pytest.mark.parametrize("dtype", [DType.F8E4M3, DType.F8E5M2])
def test_mps_fp8_decode_matches_torch(dtype):
    from tilews.metal.mps_launch import MpsLauncher
    codes = torch.arange(256, dtype=torch.uint8).view(dtype.torch_dtype).to("mps")
    out = torch.empty(256, dtype=torch.float16, device="mps")
    MpsLauncher(decode_kernel(dtype))([codes, out], grid(256, 32))
    torch.mps.synchronize()
    assert_decodes_like_torch(out.cpu(), dtype)


@needs_mlx
def test_mlx_scale_matches_torch():
    from tilews.metal.mlx_launch import MlxLauncher
    x, alpha, want = scale_inputs()
    x_mx = mx.array(x.float().numpy()).astype(mx.bfloat16)
    [y] = MlxLauncher(scale_kernel())([x_mx, alpha, N, (N,)], grid(N, THREADS))
    got = torch.from_numpy(np.array(y.astype(mx.float32))).bfloat16()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@needs_mlx
@pytest.mark.parametrize("dtype", [DType.F8E4M3, DType.F8E5M2])
def test_mlx_fp8_decode_matches_torch(dtype):
    from tilews.metal.mlx_launch import MlxLauncher
    [out] = MlxLauncher(decode_kernel(dtype))([mx.arange(256).astype(mx.uint8), (256,)], grid(256, 32))
    assert_decodes_like_torch(torch.from_numpy(np.array(out)), dtype)
