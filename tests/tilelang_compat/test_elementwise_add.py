"""TileLang's ``elementwise/example_elementwise_add.py``: an eager kernel whose in/out dtypes and
thread count are build parameters, given by keyword as ``T.float32`` or as plain strings."""
import functools

import torch

import tilews as tilelang
import tilews.language as T


@functools.cache
def elementwise_add_for(target: str):

    @tilelang.jit(target=target)
    def elementwise_add(A, B, block_M, block_N, in_dtype, out_dtype, threads):
        M, N = T.const("M, N")
        A: T.Tensor((M, N), in_dtype)
        B: T.Tensor((M, N), in_dtype)
        C = T.empty((M, N), out_dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_N), in_dtype)
            B_shared = T.alloc_shared((block_M, block_N), in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), out_dtype)
            C_shared = T.alloc_shared((block_M, block_N), out_dtype)
            T.copy(A[by * block_M, bx * block_N], A_shared)
            T.copy(B[by * block_M, bx * block_N], B_shared)
            for local_y, local_x in T.Parallel(block_M, block_N):
                C_local[local_y, local_x] = A_shared[local_y, local_x] + B_shared[local_y, local_x]
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])

        return C

    return elementwise_add


def ref_program(x, y):
    return x + y


def test_elementwise_add(target):
    """The example's ``main``: dtypes given as ``T.float32`` objects."""
    a = torch.randn(128, 96, dtype=torch.float32)
    b = torch.randn(128, 96, dtype=torch.float32)

    out = elementwise_add_for(target)(a, b, block_M=32, block_N=32, threads=128,
                                      in_dtype=T.float32, out_dtype=T.float32)

    torch.testing.assert_close(out, ref_program(a, b), rtol=1e-2, atol=1e-2)


def test_elementwise_add_string_dtypes_benchmarked(target):
    """The example's ``run_regression_perf``: a config dict splatted in, dtypes as strings, the
    call timed with ``tilelang.profiler.do_bench``."""
    a = torch.randn(64, 128, dtype=torch.float32)
    b = torch.randn(64, 128, dtype=torch.float32)
    config = {"block_M": 32, "block_N": 32, "threads": 128}
    elementwise_add = elementwise_add_for(target)

    out = elementwise_add(a, b, **config, in_dtype="float32", out_dtype="float32")

    torch.testing.assert_close(out, ref_program(a, b), rtol=1e-2, atol=1e-2)
    from tilews.profiler import do_bench

    assert do_bench(lambda: elementwise_add(a, b, **config, in_dtype="float32",
                                            out_dtype="float32")) > 0
