"""TileLang's ``norm/rms_norm.py``: the split-K kernel (``T.Serial`` walks column tiles twice, the
second time in reverse) and the whole-row kernel (slice regions ``A[a:b, :]``), both with the
string pass-config key ``"tl.disable_tma_lower"``, checked with the profiler."""
import functools

import pytest
import torch

import tilews as tilelang
import tilews.language as T
from tilews.testing import rel_err


@functools.cache
def rms_norm_splitk_for(target: str):

    @tilelang.jit(pass_configs={"tl.disable_tma_lower": True}, target=target)
    def rms_norm_splitk(A, blk_m, blk_k):
        M, N = T.const("M, N")
        dtype = T.float
        A: T.Tensor((M, N), dtype)
        B = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            A_shared = T.alloc_shared((blk_m, blk_k), dtype)
            A_local = T.alloc_fragment((blk_m, blk_k), dtype)
            A_powsum = T.alloc_fragment((blk_m,), dtype)

            num_k_step = T.ceildiv(N, blk_k)
            T.clear(A_local)
            for k in T.Serial(num_k_step):
                T.copy(A[bx * blk_m, k * blk_k], A_shared)
                for i, j in T.Parallel(blk_m, blk_k):
                    A_local[i, j] += A_shared[i, j] * A_shared[i, j]
            T.reduce_sum(A_local, A_powsum, dim=1)
            for i in T.Parallel(blk_m):
                A_powsum[i] = T.rsqrt(A_powsum[i] / N + 1e-12)

            for k in T.Serial(num_k_step):
                T.copy(A[bx * blk_m, (num_k_step - 1 - k) * blk_k], A_shared)
                for i, j in T.Parallel(blk_m, blk_k):
                    A_shared[i, j] *= A_powsum[i]
                T.copy(A_shared, B[bx * blk_m, (num_k_step - 1 - k) * blk_k])

        return B

    return rms_norm_splitk


@functools.cache
def rms_norm_for(target: str):

    @tilelang.jit(pass_configs={"tl.disable_tma_lower": True}, target=target)
    def rms_norm(A, blk_m):
        M, N = T.const("M, N")
        dtype = T.float
        A: T.Tensor((M, N), dtype)
        B = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            A_local = T.alloc_fragment((blk_m, N), dtype)
            A_pow_local = T.alloc_fragment((blk_m, N), dtype)
            A_powsum = T.alloc_fragment((blk_m,), dtype)

            T.copy(A[bx * blk_m:(bx + 1) * blk_m, :], A_local)
            for i, j in T.Parallel(blk_m, N):
                A_pow_local[i, j] = A_local[i, j] * A_local[i, j]
            T.reduce_sum(A_pow_local, A_powsum, dim=1)
            for i in T.Parallel(blk_m):
                A_powsum[i] = T.rsqrt(A_powsum[i] / N + 1e-12)
            for i, j in T.Parallel(blk_m, N):
                A_local[i, j] *= A_powsum[i]
            T.copy(A_local, B[bx * blk_m:(bx + 1) * blk_m, :])

        return B

    return rms_norm


def ref_program(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)


@pytest.mark.parametrize("blk_m", [1, 4])
def test_rms_norm(target, blk_m):
    """The example's ``test_rms_norm`` and its ``__main__`` benchmark; beyond it, the float32
    result meets a float64 reference at float32 accuracy."""
    kernel = rms_norm_for(target).compile(M=32, N=128, blk_m=blk_m)
    profiler = kernel.get_profiler()
    profiler.assert_allclose(ref_program, rtol=0.01, atol=0.01)
    a = torch.randn(32, 128)
    assert rel_err(kernel(a), ref_program(a.double())) < 1e-5
    assert profiler.do_bench(ref_program, warmup=5) > 0
    assert profiler.do_bench(warmup=5) > 0


def test_rms_norm_splitk(target):
    """The split-K kernel, which the example defines but never runs, checked the same way."""
    kernel = rms_norm_splitk_for(target).compile(M=32, N=128, blk_m=2, blk_k=32)
    kernel.get_profiler().assert_allclose(ref_program, rtol=0.01, atol=0.01)
    a = torch.randn(32, 128)
    assert rel_err(kernel(a), ref_program(a.double())) < 1e-5
