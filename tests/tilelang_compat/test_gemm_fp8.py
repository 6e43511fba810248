"""TileLang's ``gemm_fp8/example_tilelang_gemm_fp8.py`` (fp8 in, fp8 out) and
``example_tilelang_gemm_fp8_2xAcc.py`` (fp8 in, fp32 out, the tile accumulator promoted into a
second one every ``128 // block_K`` K steps plus a tail), for e4m3 and e5m2 from
``determine_fp8_type``, judged by the examples' ``calc_diff`` (1 - cosine similarity < 1e-3)."""
import functools

import pytest
import torch

import tilews as tilelang
import tilews.language as T
from tilews.language.fp8 import determine_fp8_type
from tilews.testing import rel_err


def calc_diff(x, y):
    """1 minus the (symmetric) cosine similarity of x and y, in float64."""
    x, y = x.double(), y.double()
    return 1 - 2 * (x * y).sum() / (x * x + y * y).sum()


@functools.cache
def fp8_matmul_for(target: str):

    @tilelang.jit(target=target)
    def matmul(A, B, block_M, block_N, block_K, dtype, accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((N, K), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul


@functools.cache
def fp8_2xacc_matmul_for(target: str):

    @tilelang.jit(target=target)
    def matmul(A, B, block_M, block_N, block_K, dtype, accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((N, K), dtype)
        C = T.empty((M, N), accum_dtype)

        # promote once per 128 of K (every step when block_K >= 128)
        update_interval = 128 // block_K if block_K < 128 else 1

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_shared = T.alloc_shared((block_M, block_N), accum_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_local_accum = T.alloc_fragment((block_M, block_N), accum_dtype)

            T.clear(C_local)
            T.clear(C_local_accum)
            K_iters = T.ceildiv(K, block_K)
            for k in T.Pipelined(K_iters, num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
                if (k + 1) % update_interval == 0:
                    for i, j in T.Parallel(block_M, block_N):
                        C_local_accum[i, j] += C_local[i, j]
                    T.clear(C_local)
            if K_iters % update_interval != 0:
                for i, j in T.Parallel(block_M, block_N):
                    C_local_accum[i, j] += C_local[i, j]
            T.copy(C_local_accum, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])

        return C

    return matmul


FP8_KINDS = pytest.mark.parametrize("kind", [(), ("e5m2",)], ids=["e4m3", "e5m2"])


@FP8_KINDS
def test_gemm_fp8(target, kind):
    """The example's ``test_gemm_fp8``: normal inputs cast to fp8, reference ``a @ b.T`` in fp16
    cast to fp8 (on Triton's CPU interpreter too, whose own float32 -> fp8 cast loses the carry
    of a rounding that overflows the mantissa, 7.9 -> 4.0: tilews rounds on the bits there)."""
    M, N, K = 128, 64, 128
    dtype = determine_fp8_type(*kind)
    torch_dtype = T.dtype(dtype).as_torch()
    a = torch.randn(M, K, dtype=torch.float16).to(dtype=torch_dtype)
    b = torch.randn(N, K, dtype=torch.float16).to(dtype=torch_dtype)

    c = fp8_matmul_for(target)(a, b, 64, 64, 32, dtype)

    ref_c = (a.half() @ b.half().T).to(dtype=torch_dtype)
    assert c.dtype == torch_dtype
    diff = calc_diff(c, ref_c)
    assert diff < 1e-3


@FP8_KINDS
def test_gemm_fp8_2xacc(target, kind):
    """The 2xAcc example's ``test_gemm_fp8`` (inputs uniform in [-100, 100]). K = 192 with
    block_K = 64 gives three K steps at a promotion interval of two: one promotion in the loop
    and one in the tail. Beyond the example, the result meets a float64 product at float32
    accuracy."""
    M, N, K = 64, 128, 192
    dtype = determine_fp8_type(*kind)
    torch_dtype = T.dtype(dtype).as_torch()
    a = (100 * (2 * torch.rand(M, K, dtype=torch.float16) - 1)).to(dtype=torch_dtype)
    b = (100 * (2 * torch.rand(N, K, dtype=torch.float16) - 1)).to(dtype=torch_dtype)

    # on Metal the example's 64x64 float32 shared tile and the decoded float16 operand tiles
    # take 34 KB of its 32: 32-wide tiles there (the promotion schedule is the same)
    block = 32 if target == "metal" else 64
    c = fp8_2xacc_matmul_for(target)(a, b, block, block, 64, dtype)

    assert c.dtype == torch.float32
    assert calc_diff(c, a.float() @ b.float().T) < 1e-3
    # beyond the example: fp8 products are exact in float32, so only the sums round
    assert rel_err(c, a.double() @ b.double().T) < 1e-5


def test_gemm_fp8_profiled_with_integer_supply(target):
    """The examples' ``run_regression_perf``: compile by keyword and profile with
    ``TensorSupplyType.Integer`` given positionally."""
    kernel = fp8_matmul_for(target).compile(M=64, N=64, K=64, block_M=64, block_N=64, block_K=32,
                                            dtype=determine_fp8_type())
    assert kernel.get_profiler(tilelang.TensorSupplyType.Integer).do_bench() > 0
