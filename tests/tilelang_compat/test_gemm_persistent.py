"""TileLang's ``gemm/example_gemm_persistent.py``: the rasterized one-tile-per-block GEMM and the
persistent GEMM, with ``T.Persistent`` and with the example's hand-written wave loop."""
import functools

import pytest

import tilews as tilelang
import tilews.language as T
from tilews.carver.arch import driver

from .targets import SLOW_ON_TRITON


@functools.cache
def non_persistent_matmul_for(target: str):
    """example_gemm_persistent.py's one-tile-per-block baseline (rasterized, C staged in shared)."""

    @tilelang.jit(target=target)
    def matmul_non_persistent(A, B, block_M, block_N, block_K, threads, num_stages,
                              dtype=T.float16, accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_shared = T.alloc_shared((block_M, block_N), dtype)
            T.use_swizzle(10)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[bx * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, by * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[bx * block_M, by * block_N])

        return C

    return matmul_non_persistent


@functools.cache
def persistent_matmul_for(target: str):
    """example_gemm_persistent.py's persistent GEMM: one block per SM walks the tiles, either with
    ``T.Persistent`` or with the example's hand-written wave loop (grouped by 8 along N)."""

    @tilelang.jit(target=target)
    def matmul_persistent(A, B, block_M, block_N, block_K, threads, num_stages, dtype=T.float16,
                          accum_dtype=T.float32, use_persistent_primitive=True):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        sm_num = driver.get_num_sms()
        m_blocks = T.ceildiv(M, block_M)
        n_blocks = T.ceildiv(N, block_N)
        waves = T.ceildiv(m_blocks * n_blocks, sm_num)
        group_size = 8

        with T.Kernel(sm_num, threads=threads) as (block_id):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_shared = T.alloc_shared((block_M, block_N), dtype)

            if use_persistent_primitive:
                for bx, by in T.Persistent([T.ceildiv(M, block_M), T.ceildiv(N, block_N)], sm_num,
                                           block_id):
                    T.clear(C_local)
                    for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                        T.copy(A[bx * block_M, k * block_K], A_shared)
                        T.copy(B[k * block_K, by * block_N], B_shared)
                        T.gemm(A_shared, B_shared, C_local)
                    T.copy(C_local, C_shared)
                    T.copy(C_shared, C[bx * block_M, by * block_N])
            else:
                for w in T.serial(waves):
                    tile_id = sm_num * w + block_id
                    bx = (tile_id // group_size) % m_blocks
                    by = (tile_id % group_size) + (tile_id // group_size) // m_blocks * group_size
                    if bx * block_M < M and by * block_N < N:
                        T.clear(C_local)
                        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                            T.copy(A[bx * block_M, k * block_K], A_shared)
                            T.copy(B[k * block_K, by * block_N], B_shared)
                            T.gemm(A_shared, B_shared, C_local)
                        T.copy(C_local, C_shared)
                        T.copy(C_shared, C[bx * block_M, by * block_N])

        return C

    return matmul_persistent


def gemm_reference(A, B):
    return A @ B


def test_gemm_non_persistent(target):
    """The example's baseline check: Randn inputs, ``assert_allclose`` at 0.01, ``do_bench``."""
    kernel = non_persistent_matmul_for(target).compile(
        M=128, N=128, K=64, block_M=64, block_N=64, block_K=32, threads=128, num_stages=3)
    profiler = kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Randn)
    profiler.assert_allclose(gemm_reference, rtol=0.01, atol=0.01)
    assert profiler.do_bench(warmup=5) > 0


@pytest.mark.parametrize("use_persistent_primitive", [True, False], ids=["T.Persistent", "wave_loop"])
@SLOW_ON_TRITON
def test_gemm_persistent(target, use_persistent_primitive):
    """The example's persistent check, for both tile walks. Without a GPU ``get_num_sms()`` is
    132, so one wave covers the 2 x 3 tiles; the wave loop finds them at tile ids 0-2 and 8-10."""
    kernel = persistent_matmul_for(target).compile(
        M=128, N=192, K=64, block_M=64, block_N=64, block_K=32, threads=128, num_stages=3,
        use_persistent_primitive=use_persistent_primitive)
    profiler = kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Randn)
    profiler.assert_allclose(gemm_reference, rtol=0.01, atol=0.01)
    assert profiler.do_bench(warmup=5) > 0
