"""TileLang's ``gemm/example_gemm_autotune_pass_configs.py``: a ``C = A @ B.T`` GEMM tuned over
pipeline depth and a per-config ``pass_configs`` entry (``PassConfigKey.TL_DISABLE_WARP_SPECIALIZED``
on and off), through the builder (integer inputs, checked against the reference, grouped
compilation) and through ``@autotune`` over ``@tl.jit(out_idx=[-1])``."""
import functools
import itertools

import torch

import tilews as tl
import tilews.language as T
from tilews.autotuner import AutoTuner, autotune
from tilews.transform import PassConfigKey


def ref_program(A, B):
    return A @ B.T


def get_configs():
    """Kernel parameters crossed with a pass-config switch: four configs."""
    configs = []
    for bm, bn, bk, ns, tn, ws in itertools.product([64], [64], [32], [1, 2], [128], [True, False]):
        configs.append({
            "block_M": bm,
            "block_N": bn,
            "block_K": bk,
            "num_stages": ns,
            "thread_num": tn,
            "pass_configs": {PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: ws},
        })
    return configs


def get_best_config(M, N, K, target):
    """The example's API mode; the kernel closes over the problem size."""

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

    autotuner = (
        AutoTuner.from_kernel(kernel=kernel, configs=get_configs())
        .set_compile_args(out_idx=[-1], target=target)
        .set_profile_args(supply_type=tl.TensorSupplyType.Integer, ref_prog=ref_program,
                          skip_check=False)
    )
    return autotuner.run(warmup=3, rep=5, enable_grouped_compile=True)


@functools.cache
def matmul_decorator_for(target: str):

    @autotune(configs=get_configs(), warmup=3, rep=5)
    @tl.jit(out_idx=[-1], target=target)
    def matmul_decorator(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=2,
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

    return matmul_decorator


def assert_computes_a_bt(kernel, M, N, K):
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(N, K, dtype=torch.float16)
    torch.testing.assert_close(kernel(a, b), ref_program(a, b), rtol=1e-2, atol=1e-2)


def test_api_mode(target):
    """The example's ``main``: the best config, pass configs included, with its latency."""
    M, N, K = 128, 64, 64
    result = get_best_config(M, N, K, target)
    assert result.config in get_configs()
    assert result.config["pass_configs"] in ({PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True},
                                             {PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: False})
    assert result.latency > 0
    assert result.ref_latency > 0
    assert_computes_a_bt(result.kernel, M, N, K)


def test_decorator_mode(target):
    """The example's ``main_decorator``: tuning by calling the factory with the problem size."""
    M, N, K = 64, 128, 64
    kernel = matmul_decorator_for(target)(M, N, K)
    assert len(kernel.get_kernel_source()) > 0
    assert kernel.config in get_configs()
    assert_computes_a_bt(kernel, M, N, K)
