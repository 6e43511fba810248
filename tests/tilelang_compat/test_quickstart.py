"""TileLang's ``quickstart.py``: an eager matmul + ReLU, compiled with ``fn.compile(M=...)``,
checked against torch and profiled."""
import functools

import torch

import tilews as tilelang
import tilews.language as T


@functools.cache
def quickstart_matmul_for(target: str):
    """quickstart.py's matmul + ReLU; dtypes fixed in the body, block sizes annotated ``int``."""

    @tilelang.jit(target=target)
    def matmul(A, B, block_M: int, block_N: int, block_K: int):
        M, N, K = T.const("M, N, K")
        dtype = T.float16
        accum_dtype = T.float32
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                T.copy(B[ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(block_M, block_N):
                C_local[i, j] = T.max(C_local[i, j], 0)
            T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul


def test_quickstart(target):
    """The quickstart script: compile, compare with ``relu(a @ b)``, read the source, profile."""
    M, N, K = 128, 96, 64
    kernel = quickstart_matmul_for(target).compile(M=M, N=N, K=K, block_M=64, block_N=32, block_K=32)
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)

    c = kernel(a, b)

    torch.testing.assert_close(c, torch.relu(a @ b), rtol=1e-2, atol=1e-2)
    assert kernel.get_kernel_source()
    profiler = kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Normal)
    assert profiler.do_bench() > 0
