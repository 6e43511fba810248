"""TileLang's ``gemm/example_gemm_autotune_early_stop.py``: a ``C = A @ B.T`` GEMM tuned over tile
sizes with ``early_stop``, through the builder (``AutoTuner.from_kernel(...).run(...)``, with and
without early stop) and through ``@autotune(..., early_stop=True)`` over ``@tl.jit(out_idx=[-1])``.
As in the example, the builder's kernel reads ``M, N, K`` from module globals."""
import functools

import torch

import tilews as tl
import tilews.language as T
from tilews.autotuner import AutoTuner, autotune

from .targets import SLOW_ON_TRITON

M, N, K = 128, 128, 64


def get_configs():
    """Tile sizes far enough apart to give early stop something to cut."""
    configs = []
    for bm, bn in [(64, 64), (32, 64), (32, 32)]:
        for ns in [2, 1]:
            configs.append({"block_M": bm, "block_N": bn, "block_K": 32, "num_stages": ns,
                            "thread_num": 128})
    return configs


def make_kernel():
    """The builder mode's kernel: configuration keywords in, a prim_func out."""

    def kernel(block_M=None, block_N=None, block_K=None, num_stages=None, thread_num=None):
        dtype = T.float16
        accum_dtype = T.float32

        @T.prim_func
        def main(
            A: T.Tensor((M, K), dtype),
            B: T.Tensor((N, K), dtype),
            C: T.Tensor((M, N), dtype),
        ):
            with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
                A_shared = T.alloc_shared((block_M, block_K), dtype)
                B_shared = T.alloc_shared((block_N, block_K), dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
                T.use_swizzle(panel_size=10)
                T.clear(C_local)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[by * block_M, k * block_K], A_shared)
                    T.copy(B[bx * block_N, k * block_K], B_shared)
                    T.gemm(A_shared, B_shared, C_local, transpose_B=True)
                T.copy(C_local, C[by * block_M, bx * block_N])

        return main

    return kernel


@functools.cache
def matmul_early_stop_for(target: str):

    @autotune(configs=get_configs(), warmup=5, rep=10, early_stop=True, early_stop_factor=2.0)
    @tl.jit(out_idx=[-1], target=target)
    def matmul_early_stop(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=2,
                          thread_num=128):
        dtype = T.float16
        accum_dtype = T.float32

        @T.prim_func
        def main(
            A: T.Tensor((M, K), dtype),
            B: T.Tensor((N, K), dtype),
            C: T.Tensor((M, N), dtype),
        ):
            with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
                A_shared = T.alloc_shared((block_M, block_K), dtype)
                B_shared = T.alloc_shared((block_N, block_K), dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
                T.use_swizzle(panel_size=10)
                T.clear(C_local)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[by * block_M, k * block_K], A_shared)
                    T.copy(B[bx * block_N, k * block_K], B_shared)
                    T.gemm(A_shared, B_shared, C_local, transpose_B=True)
                T.copy(C_local, C[by * block_M, bx * block_N])

        return main

    return matmul_early_stop


def assert_computes_a_bt(kernel):
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(N, K, dtype=torch.float16)
    torch.testing.assert_close(kernel(a, b), a @ b.T, rtol=1e-2, atol=1e-2)


@SLOW_ON_TRITON
def test_api_mode(target):
    """The example's ``run_api_mode``: tune without and with early stop; each run reports a
    latency and one of the configs, and its kernel computes ``A @ B.T``."""
    configs = get_configs()
    for early_stop in [False, True]:
        autotuner = (AutoTuner.from_kernel(kernel=make_kernel(), configs=configs)
                     .set_compile_args(out_idx=[-1], target=target).set_profile_args())
        result = autotuner.run(warmup=5, rep=10, early_stop=early_stop, early_stop_factor=1.2)
        assert result.latency > 0
        assert result.config in configs
        assert_computes_a_bt(result.kernel)


@SLOW_ON_TRITON
def test_decorator_mode(target):
    """The example's ``run_decorator_mode``: calling the factory with the problem size tunes and
    returns the best kernel, which has source and carries its config."""
    kernel = matmul_early_stop_for(target)(M, N, K)
    assert len(kernel.get_kernel_source()) > 0
    assert kernel.config in get_configs()
    assert kernel.latency > 0
    assert_computes_a_bt(kernel)
