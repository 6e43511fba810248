"""TileLang's ``gemm/example_gemm.py``: the eager GEMM with dtype build parameters."""
import functools

import torch

import tilews as tilelang
import tilews.language as T


@functools.cache
def example_gemm_matmul_for(target: str):
    """example_gemm.py's matmul: dtypes are build parameters with defaults."""

    @tilelang.jit(target=target)
    def matmul(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul


def test_example_gemm(target):
    """The example's ``main``: compile by keyword, compare with ``a @ b``, benchmark."""
    M, N, K = 96, 128, 64
    kernel = example_gemm_matmul_for(target).compile(M=M, N=N, K=K, block_M=32, block_N=64, block_K=32)
    a = torch.randn(M, K).half()
    b = torch.randn(K, N).half()

    c = kernel(a, b)

    torch.testing.assert_close(c, a @ b, rtol=1e-2, atol=1e-2)
    assert kernel.get_kernel_source()
    assert kernel.get_profiler().do_bench(backend="cupti") > 0
