"""TileLang's five ``warp_specialize/example_warp_specialize_gemm_*.py`` examples: eager GEMMs
whose 256 threads split into two 128-thread warp groups (``T.ws``) that hand tiles over through
mbarriers (``T.alloc_barrier``, ``T.tma_copy``, the positional and keyword barrier forms) or, in
``copy_gemm_0_1``, split the N tile between them."""
import functools

import pytest
import torch

import tilews as tilelang
import tilews.language as T
from tilews.testing import rel_err


@functools.cache
def barrierpipe_stage2_for(target: str):
    """Two-stage ring of shared tiles, a plain ``range`` loop, slice regions for ``tma_copy``,
    and ``T.mbarrier_wait_parity`` / ``T.mbarrier_arrive`` by keyword."""

    @tilelang.jit(target=target)
    def matmul(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        num_stages = 2
        # barriers 0..num_stages-1: "stage s is loaded"; num_stages..2*num_stages-1: "stage s is free"
        mbarrier_list = [128, 128] * num_stages

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((num_stages, block_M, block_K), dtype)
            B_shared = T.alloc_shared((num_stages, block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            mbars = T.alloc_barrier(mbarrier_list)

            with T.ws(0):
                T.clear(C_local)

            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(1):
                    T.mbarrier_wait_parity(mbarrier=mbars[ko % num_stages + num_stages],
                                           parity=((ko // num_stages) % num_stages) ^ 1)
                    T.tma_copy(A[by * block_M:(by + 1) * block_M, ko * block_K:(ko + 1) * block_K],
                               A_shared[ko % num_stages, :, :], barrier=mbars[ko % num_stages])
                    T.tma_copy(B[ko * block_K:(ko + 1) * block_K, bx * block_N:(bx + 1) * block_N],
                               B_shared[ko % num_stages, :, :], barrier=mbars[ko % num_stages])
                    T.mbarrier_arrive(mbarrier=mbars[ko % num_stages])
                with T.ws(0):
                    T.mbarrier_wait_parity(mbarrier=mbars[ko % num_stages],
                                           parity=(ko // num_stages) % num_stages)
                    T.gemm(A_shared[ko % num_stages, :, :], B_shared[ko % num_stages, :, :], C_local)
                    T.mbarrier_arrive(mbarrier=mbars[ko % num_stages + num_stages])

            with T.ws(0):
                T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul


@functools.cache
def copy_0_gemm_1_for(target: str):
    """Warp group 0 loads (``tma_copy`` into one shared tile), warp group 1 multiplies; two
    single barriers (``arrive_count=`` keyword) and the positional ``barrier_wait``."""

    @tilelang.jit(target=target)
    def matmul_warp_specialize_copy_0_gemm_1(A, B, block_M, block_N, block_K, dtype=T.float16,
                                             accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            data_is_ready = T.alloc_barrier(arrive_count=128)
            compute_is_done = T.alloc_barrier(arrive_count=128)

            with T.ws(1):
                T.clear(C_local)

            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=0):
                with T.ws(0):
                    T.barrier_wait(compute_is_done, (ko + 1) % 2)
                    T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                    T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                    T.barrier_arrive(data_is_ready)
                with T.ws(1):
                    T.barrier_wait(data_is_ready, ko % 2)
                    T.gemm(A_shared, B_shared, C_local)
                    T.barrier_arrive(compute_is_done)

            with T.ws(1):
                T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul_warp_specialize_copy_0_gemm_1


@functools.cache
def copy_1_gemm_0_for(target: str):
    """The mirror of ``copy_0_gemm_1``: warp group 1 loads, warp group 0 multiplies, and the
    loop asks for two pipeline stages."""

    @tilelang.jit(target=target)
    def matmul_warp_specialize_copy_1_gemm_0(A, B, block_M, block_N, block_K, dtype=T.float16,
                                             accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            data_is_ready = T.alloc_barrier(arrive_count=128)
            compute_is_done = T.alloc_barrier(arrive_count=128)

            with T.ws(0):
                T.clear(C_local)

            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                with T.ws(1):
                    T.barrier_wait(compute_is_done, (ko + 1) % 2)
                    T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                    T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                    T.barrier_arrive(data_is_ready)
                with T.ws(0):
                    T.barrier_wait(data_is_ready, ko % 2)
                    T.gemm(A_shared, B_shared, C_local)
                    T.barrier_arrive(compute_is_done)

            with T.ws(0):
                T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul_warp_specialize_copy_1_gemm_0


@functools.cache
def copy_gemm_0_1_for(target: str):
    """Both warp groups copy and multiply, each its own half of the N tile; A is loaded by the
    whole block, shared tiles use the explicit ``"shared"`` scope, ``pass_configs={}``."""

    @tilelang.jit(pass_configs={}, target=target)
    def matmul_warp_specialize_copy_gemm_0_1(A, B, block_M, block_N, block_K, dtype=T.float16,
                                             accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        warp_group_num = 2
        threads = 128 * warp_group_num

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype, "shared")
            B_shared_g0 = T.alloc_shared((block_K, block_N // warp_group_num), dtype, "shared")
            B_shared_g1 = T.alloc_shared((block_K, block_N // warp_group_num), dtype, "shared")
            C_local_g0 = T.alloc_fragment((block_M, block_N // warp_group_num), accum_dtype)
            C_local_g1 = T.alloc_fragment((block_M, block_N // warp_group_num), accum_dtype)

            with T.ws(1):
                T.clear(C_local_g1)
            with T.ws(0):
                T.clear(C_local_g0)

            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=0):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                with T.ws(1):
                    T.copy(B[ko * block_K, bx * block_N], B_shared_g1)
                    T.gemm(A_shared, B_shared_g1, C_local_g1)
                with T.ws(0):
                    T.copy(B[ko * block_K, bx * block_N + block_N // warp_group_num], B_shared_g0)
                    T.gemm(A_shared, B_shared_g0, C_local_g0)

            with T.ws(1):
                T.copy(C_local_g1, C[by * block_M, bx * block_N])
            with T.ws(0):
                T.copy(C_local_g0, C[by * block_M, bx * block_N + block_N // warp_group_num])

        return C

    return matmul_warp_specialize_copy_gemm_0_1


@functools.cache
def softpipe_stage2_for(target: str):
    """``copy_1_gemm_0`` as the softpipe example spells it (function named ``matmul``)."""

    @tilelang.jit(target=target)
    def matmul(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)

        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            data_is_ready = T.alloc_barrier(arrive_count=128)
            compute_is_done = T.alloc_barrier(arrive_count=128)

            with T.ws(0):
                T.clear(C_local)

            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                with T.ws(1):
                    T.barrier_wait(compute_is_done, (ko + 1) % 2)
                    T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                    T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                    T.barrier_arrive(data_is_ready)
                with T.ws(0):
                    T.barrier_wait(data_is_ready, ko % 2)
                    T.gemm(A_shared, B_shared, C_local)
                    T.barrier_arrive(compute_is_done)

            with T.ws(0):
                T.copy(C_local, C[by * block_M, bx * block_N])

        return C

    return matmul


PROGRAMS = {
    "barrierpipe_stage2": barrierpipe_stage2_for,
    "copy_0_gemm_1": copy_0_gemm_1_for,
    "copy_1_gemm_0": copy_1_gemm_0_for,
    "copy_gemm_0_1": copy_gemm_0_1_for,
    "softpipe_stage2": softpipe_stage2_for,
}


@pytest.mark.parametrize("example", list(PROGRAMS))
def test_warp_specialized_gemm(target, example):
    """As each example's ``main``: call with tensors and block sizes, compare with ``a @ b``, then
    time the call with ``tilelang.profiler.do_bench``. K spans six tiles, so the two-stage ring's
    barriers wrap their phase (0, 1, 0) and the single barriers complete six phases. Beyond the
    example, the result is compared with a float64 product."""
    matmul = PROGRAMS[example](target)
    block_M, block_N, block_K = 64, 64, 32
    a = torch.randn(128, 192, dtype=torch.float16)
    b = torch.randn(192, 128, dtype=torch.float16)

    c = matmul(a, b, block_M, block_N, block_K)

    torch.testing.assert_close(c, a @ b, rtol=1e-2, atol=1e-2)
    assert rel_err(c, a.double() @ b.double()) < 2e-3
    from tilews.profiler import do_bench

    assert do_bench(lambda: matmul(a, b, block_M, block_N, block_K)) > 0


@pytest.mark.parametrize("example", ["barrierpipe_stage2", "copy_0_gemm_1", "copy_1_gemm_0"])
def test_hopper_lowering_computes_the_same(example):
    """docs/ws-semantics.md #12: the interpreter's result for the Hopper lowering of the example
    (its own k tiles) equals the frontend program's under random schedules."""
    from ..test_ws_oracle import AS_WRITTEN_K, assert_same_under_schedules

    M, N, K = 128, 128, 192
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    kernel = PROGRAMS[example]("interpret").compile(M=M, N=N, K=K, block_M=64, block_N=64,
                                                    block_K=32)
    assert_same_under_schedules(kernel.ir_before, [a, b, torch.empty(M, N, dtype=torch.float16)],
                                2, seeds=range(5), target=AS_WRITTEN_K)
