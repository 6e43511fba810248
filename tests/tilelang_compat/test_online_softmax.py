"""TileLang's ``online_softmax/online_softmax.py``: an eager row softmax over column tiles (a
running log-sum-exp in base 2, then a second pass writing ``exp2(x - lse)``). As in the example,
the kernel's ``M`` and ``N`` are module globals, assigned only after the function is defined;
their values are read when the kernel is first compiled. The ``dtype: T.dtype`` parameter is a
build-time constant."""
import functools

import torch

import tilews as tilelang
import tilews.language as T

from .targets import SLOW_ON_TRITON


@functools.cache
def softmax_kernel_for(target: str):

    @tilelang.jit(target=target)
    def softmax_kernel(X, BLOCK_M=1, BLOCK_N=8192, dtype: T.dtype = T.float16):
        X: T.Tensor([M, N], dtype)
        Y = T.empty([M, N], dtype)

        accum_dtype = T.float32
        scale = 1.44269504  # log2(e)

        with T.Kernel(T.ceildiv(M, BLOCK_M), threads=128) as (i_m):
            x = T.alloc_fragment([BLOCK_M, BLOCK_N], dtype)
            y = T.alloc_fragment([BLOCK_M, BLOCK_N], dtype)
            lse = T.alloc_fragment([BLOCK_M], accum_dtype)
            max_x = T.alloc_fragment([BLOCK_M], dtype)
            exp_x = T.alloc_fragment([BLOCK_M, BLOCK_N], accum_dtype)
            sum_exp_x = T.alloc_fragment([BLOCK_M], accum_dtype)
            T.fill(lse, -T.infinity(accum_dtype))

            for i_n in T.Pipelined(T.ceildiv(N, BLOCK_N)):
                T.copy(X[i_m * BLOCK_M, i_n * BLOCK_N], x)
                T.reduce_max(x, max_x, dim=1, clear=True)
                for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                    exp_x[i, j] = T.exp2(x[i, j] * scale - max_x[i] * scale)
                T.reduce_sum(exp_x, sum_exp_x, dim=1, clear=True)
                for i in T.Parallel(BLOCK_M):
                    lse[i] = max_x[i] * scale + T.log2(T.exp2(lse[i] - max_x[i] * scale) + sum_exp_x[i])

            for i_n in T.Pipelined(T.ceildiv(N, BLOCK_N)):
                T.copy(X[i_m * BLOCK_M, i_n * BLOCK_N], x)
                for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                    y[i, j] = T.exp2(x[i, j] * scale - lse[i])
                T.copy(y, Y[i_m * BLOCK_M, i_n * BLOCK_N])

        return Y

    return softmax_kernel


M = 32
N = 256


@SLOW_ON_TRITON
def test_online_softmax(target):
    """The example's script: compare with ``X.softmax(dim=1)`` and time both with
    ``tilelang.profiler.do_bench``. Column tiles of 64 (the example's one 8192-wide tile equals
    its N) make the running log-sum-exp combine four tiles per row."""
    softmax_kernel = softmax_kernel_for(target)
    X = torch.randn(M, N, dtype=torch.float16)

    Y = softmax_kernel(X, BLOCK_N=64)

    torch.testing.assert_close(Y, X.softmax(dim=1), rtol=1e-2, atol=1e-2)
    from tilews.profiler import do_bench

    assert do_bench(lambda: X.softmax(dim=1), warmup=25, rep=100) > 0
    assert do_bench(lambda: softmax_kernel(X, BLOCK_N=64), warmup=25, rep=100) > 0
