"""TileLang's language surface on tilews (issue 12, item 4): the kernels of TileLang's examples
run with only their imports changed.

* The acceptance programs are the kernel bodies of TileLang's ``examples/warp_specialize/
  example_warp_specialize_gemm_{barrierpipe_stage2,copy_0_gemm_1,copy_1_gemm_0,copy_gemm_0_1,
  softpipe_stage2}.py``, ``norm/layernorm.py`` (forward and backward), ``norm/rms_norm.py``,
  ``flash_attention/example_mha_fwd_bhsd.py`` and ``gemm_fp8/example_tilelang_gemm_fp8_2xAcc.py``,
  written here in the factory style at small sizes. Each runs on ``target="interpret"`` and
  ``"triton"`` against a torch reference on random inputs, and compiles for ``"hopper"`` (Gluon,
  or triton.language with the reason in the report).
* The constructs they need, one test each: slices whose extent is an expression, allocations
  inside role blocks used by later blocks, statements outside every role (block-wide steps),
  ``T.tma_copy``, keyword spellings of the barrier operations, ``T.GemmWarpPolicy`` and the
  hints of ``T.gemm`` / ``T.Pipelined``, ``T.Serial`` / ``T.vectorized`` / ``range``,
  ``T.dtype`` and dtypes as strings, ``T.Cast`` / ``astype``, ``T.use_swizzle``'s keywords,
  ``T.atomic_add(memory_order=...)``, ``determine_fp8_type``.
"""
from __future__ import annotations

import math

import pytest
import torch

import tilews
import tilews.language as T
from tilews.language.fp8 import determine_fp8_type
from tilews.lowering import ir

from .helpers import marked_line, randn, rel_err

TARGETS = ["interpret", "triton"]


def build(factory, *args, target="interpret", out_idx=-1, **kw):
    return tilews.jit(out_idx=out_idx, target=target)(factory)(*args, **kw)


def gemm_ref(a, b):
    return a.double() @ b.double()


# ----------------------------------------------------------------------------------------------
# TileLang's examples/warp_specialize


def ws_copy_gemm(producer, consumer, stages):
    """copy_1_gemm_0 / softpipe_stage2 (producer 1, consumer 0, stages 2) and copy_0_gemm_1
    (producer 0, consumer 1, stages 0): one shared tile pair handed over by two barriers."""
    def matmul(M, N, K, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
        @T.prim_func
        def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                 C: T.Tensor((M, N), dtype)):
            with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
                A_shared = T.alloc_shared((block_M, block_K), dtype)
                B_shared = T.alloc_shared((block_K, block_N), dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
                data_is_ready = T.alloc_barrier(arrive_count=128)
                compute_is_done = T.alloc_barrier(arrive_count=128)
                with T.ws(consumer):
                    T.clear(C_local)
                for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages):
                    with T.ws(producer):
                        T.barrier_wait(compute_is_done, (ko + 1) % 2)
                        T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                        T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                        T.barrier_arrive(data_is_ready)
                    with T.ws(consumer):
                        T.barrier_wait(data_is_ready, ko % 2)
                        T.gemm(A_shared, B_shared, C_local)
                        T.barrier_arrive(compute_is_done)
                with T.ws(consumer):
                    T.copy(C_local, C[by * block_M, bx * block_N])
        return main
    return matmul


def ws_barrierpipe(M, N, K, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    """barrierpipe_stage2: a two-slot ring indexed by ``ko % num_stages``, full/empty barriers in
    one list, keyword barrier operations, slices with expression extents."""
    num_stages = 2
    mbarrier_list = [128, 128] * num_stages

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
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
    return main


def ws_copy_gemm_0_1(M, N, K, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    """copy_gemm_0_1: the copy of A's tile is outside every role (a block-wide step both roles
    read), no barriers; each role multiplies by its half of B's columns."""
    warp_group_num = 2
    threads = 128 * warp_group_num

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
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
    return main


WS_GEMMS = {"copy_1_gemm_0": ws_copy_gemm(1, 0, 2), "softpipe_stage2": ws_copy_gemm(1, 0, 2),
            "copy_0_gemm_1": ws_copy_gemm(0, 1, 0), "barrierpipe_stage2": ws_barrierpipe,
            "copy_gemm_0_1": ws_copy_gemm_0_1}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(WS_GEMMS))
def test_warp_specialize_examples(name, target):
    M, N, K = 128, 128, 192            # 6 k-tiles: the barriers' phases wrap several times
    a, b = randn(M, K, dtype=torch.float16, seed=1), randn(K, N, dtype=torch.float16, seed=2)
    kernel = build(WS_GEMMS[name], M, N, K, 64, 64, 32, target=target)
    assert rel_err(kernel(a, b), gemm_ref(a, b)) < 2e-3


# ----------------------------------------------------------------------------------------------
# TileLang's examples/norm


def layernorm_fwd(N, D, eps=1e-5, blk_m=1, threads=256, in_dtype="bfloat16", out_dtype="bfloat16"):
    accum_dtype = "float"

    @T.prim_func
    def main(X: T.Tensor((N, D), in_dtype), gamma: T.Tensor((D,), in_dtype),
             beta: T.Tensor((D,), in_dtype), Y: T.Tensor((N, D), out_dtype),
             Mean: T.Tensor((N,), accum_dtype), Rstd: T.Tensor((N,), accum_dtype)):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            X_smem = T.alloc_shared((blk_m, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            B_smem = T.alloc_shared((D,), in_dtype)
            X_local = T.alloc_fragment((blk_m, D), accum_dtype)
            X_sq_local = T.alloc_fragment((blk_m, D), accum_dtype)
            sum_row = T.alloc_fragment((blk_m,), accum_dtype)
            sumsq_row = T.alloc_fragment((blk_m,), accum_dtype)
            mean_row = T.alloc_fragment((blk_m,), accum_dtype)
            rstd_row = T.alloc_fragment((blk_m,), accum_dtype)

            T.copy(X[bx * blk_m, 0], X_smem)
            T.copy(gamma, G_smem)
            T.copy(beta, B_smem)
            for i, j in T.Parallel(blk_m, D):
                X_local[i, j] = T.Cast(accum_dtype, X_smem[i, j])
            for i, j in T.Parallel(blk_m, D):
                X_sq_local[i, j] = X_local[i, j] * X_local[i, j]
            T.reduce_sum(X_local, sum_row, dim=1)
            T.reduce_sum(X_sq_local, sumsq_row, dim=1)
            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)
            for i in T.Parallel(blk_m):
                mean_row[i] = sum_row[i] * inv_D
                rstd_row[i] = T.rsqrt(sumsq_row[i] * inv_D - mean_row[i] * mean_row[i]
                                      + T.Cast(accum_dtype, eps))
                Mean[bx * blk_m + i] = mean_row[i]
                Rstd[bx * blk_m + i] = rstd_row[i]
            for i, j in T.Parallel(blk_m, D):
                norm = (X_local[i, j] - mean_row[i]) * rstd_row[i]
                X_smem[i, j] = T.Cast(out_dtype, norm * T.Cast(accum_dtype, G_smem[j])
                                      + T.Cast(accum_dtype, B_smem[j]))
            T.copy(X_smem, Y[bx * blk_m, 0])
    return main


def layernorm_bwd(N, D, blk_m=32, threads=256, in_dtype="bfloat16"):
    accum_dtype = "float"

    @T.prim_func
    def main(DY: T.Tensor((N, D), in_dtype), X: T.Tensor((N, D), in_dtype),
             gamma: T.Tensor((D,), in_dtype), Mean: T.Tensor((N,), accum_dtype),
             Rstd: T.Tensor((N,), accum_dtype), DX: T.Tensor((N, D), in_dtype),
             DGamma: T.Tensor((D,), accum_dtype), DBeta: T.Tensor((D,), accum_dtype)):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            DY_smem = T.alloc_shared((1, D), in_dtype)
            X_smem = T.alloc_shared((1, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            DX_smem = T.alloc_shared((1, D), in_dtype)
            x_hat = T.alloc_fragment((1, D), accum_dtype)
            dx_hat = T.alloc_fragment((1, D), accum_dtype)
            dx_hat_x_hat = T.alloc_fragment((1, D), accum_dtype)
            sum_dx_hat = T.alloc_fragment((1,), accum_dtype)
            sum_dx_hat_x_hat = T.alloc_fragment((1,), accum_dtype)
            dgamma_acc = T.alloc_fragment((D,), accum_dtype)
            dbeta_acc = T.alloc_fragment((D,), accum_dtype)

            T.copy(gamma, G_smem)
            T.clear(dgamma_acc)
            T.clear(dbeta_acc)
            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)
            for k in T.serial(blk_m):
                row = bx * blk_m + k
                T.copy(DY[row, 0], DY_smem)
                T.copy(X[row, 0], X_smem)
                m_v = Mean[row]
                r_v = Rstd[row]
                for i, j in T.Parallel(1, D):
                    xv = T.Cast(accum_dtype, X_smem[i, j])
                    dy_v = T.Cast(accum_dtype, DY_smem[i, j])
                    g_v = T.Cast(accum_dtype, G_smem[j])
                    x_hat[i, j] = (xv - m_v) * r_v
                    dx_hat[i, j] = dy_v * g_v
                    dx_hat_x_hat[i, j] = dx_hat[i, j] * x_hat[i, j]
                T.reduce_sum(dx_hat, sum_dx_hat, dim=1)
                T.reduce_sum(dx_hat_x_hat, sum_dx_hat_x_hat, dim=1)
                for i, j in T.Parallel(1, D):
                    c1 = sum_dx_hat_x_hat[0] * inv_D
                    c2 = sum_dx_hat[0] * inv_D
                    dx_v = r_v * (dx_hat[i, j] - c2 - x_hat[i, j] * c1)
                    DX_smem[i, j] = T.Cast(in_dtype, dx_v)
                    dy_v = T.Cast(accum_dtype, DY_smem[i, j])
                    dgamma_acc[j] += dy_v * x_hat[i, j]
                    dbeta_acc[j] += dy_v
                T.copy(DX_smem, DX[row, 0])
            for j in T.Parallel(D):
                T.atomic_add(DGamma[j], dgamma_acc[j], memory_order="relaxed")
                T.atomic_add(DBeta[j], dbeta_acc[j], memory_order="relaxed")
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_layernorm_forward_and_backward(target):
    N, D, eps = 16, 128, 1e-5
    x = randn(N, D, seed=3).to(torch.bfloat16)
    g, b = randn(D, seed=4).to(torch.bfloat16), randn(D, seed=5).to(torch.bfloat16)
    dy = randn(N, D, seed=6).to(torch.bfloat16)
    y, mean, rstd = build(layernorm_fwd, N, D, eps, target=target, out_idx=[-3, -2, -1])(x, g, b)
    xr, gr, br = (t.double().requires_grad_(True) for t in (x, g, b))
    yr = torch.nn.functional.layer_norm(xr, (D,), gr, br, eps)
    assert rel_err(y, yr) < 1e-2
    assert rel_err(mean, xr.mean(-1)) < 1e-5
    assert rel_err(rstd, torch.rsqrt(xr.var(-1, unbiased=False) + eps)) < 1e-5
    yr.backward(dy.double())
    dgamma, dbeta = torch.zeros(D), torch.zeros(D)
    dx = build(layernorm_bwd, N, D, 4, target=target, out_idx=[-3])(dy, x, g, mean, rstd, dgamma,
                                                                      dbeta)
    assert rel_err(dx, xr.grad) < 1e-2
    assert rel_err(dgamma, gr.grad) < 1e-4 and rel_err(dbeta, br.grad) < 1e-4


def rms_norm_splitk(M, N, blk_m, blk_k):
    dtype = T.float

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
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
    return main


def rms_norm(M, N, blk_m):
    dtype = T.float

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
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
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_rms_norm(target):
    M, N = 8, 256
    a = randn(M, N, seed=7)
    ref = a.double() * torch.rsqrt(a.double().pow(2).mean(-1, keepdim=True) + 1e-12)
    assert rel_err(build(rms_norm, M, N, 2, target=target)(a), ref) < 1e-5
    assert rel_err(build(rms_norm_splitk, M, N, 2, 64, target=target)(a), ref) < 1e-5


# ----------------------------------------------------------------------------------------------
# TileLang's examples/flash_attention/example_mha_fwd_bhsd.py


def flashattn(batch, heads, seq_q, seq_kv, dim, is_causal, block_M=64, block_N=64, num_stages=1,
              threads=128):
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    q_shape = [batch, heads, seq_q, dim]
    kv_shape = [batch, heads, seq_kv, dim]
    dtype = T.float16
    accum_dtype = T.float32
    past_len = seq_kv - seq_q

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype),
             V: T.Tensor(kv_shape, dtype), Output: T.Tensor(q_shape, dtype)):
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, by, bx * block_M:(bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            loop_range = (
                T.min(T.ceildiv(seq_kv, block_N), T.ceildiv((bx + 1) * block_M + past_len, block_N))
                if is_causal else T.ceildiv(seq_kv, block_N))
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(K[bz, by, k * block_N:(k + 1) * block_N, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        q_idx = bx * block_M + i + past_len
                        k_idx = k * block_N + j
                        acc_s[i, j] = T.if_then_else(q_idx >= k_idx, 0, -T.infinity(acc_s.dtype))
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_kv,
                                                     -T.infinity(acc_s.dtype), 0)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, by, k * block_N:(k + 1) * block_N, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M:(bx + 1) * block_M, :])
    return main


def attention_ref(q, k, v, is_causal):
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        seq_q, seq_kv = q.shape[2], k.shape[2]
        mask = torch.tril(torch.ones(seq_q, seq_kv), seq_kv - seq_q)
        scores = scores.masked_fill(mask == 0, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seq", [64, 100])
@pytest.mark.parametrize("is_causal", [False, True])
def test_mha_fwd_bhsd(is_causal, seq, target):
    shape = (1, 2, seq, 32)
    q, k, v = (randn(*shape, dtype=torch.float16, seed=s) for s in (8, 9, 10))
    kernel = build(flashattn, 1, 2, seq, seq, 32, is_causal, out_idx=[3], target=target)
    assert rel_err(kernel(q, k, v), attention_ref(q, k, v, is_causal)) < 1e-2


# ----------------------------------------------------------------------------------------------
# TileLang's examples/gemm_fp8/example_tilelang_gemm_fp8_2xAcc.py


def fp8_2xacc(M, N, K, block_M, block_N, block_K, dtype, accum_dtype=T.float32):
    update_interval = 128 // block_K if block_K < 128 else 1

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype),
             C: T.Tensor((M, N), accum_dtype)):
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
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_2xacc(fmt, target):
    M, N, K = 64, 64, 160              # 5 k-tiles of 32, promoted every 4: the tail is used
    dtype = determine_fp8_type(fmt)
    torch_dtype = T.dtype(dtype).as_torch()
    a = (100 * (2 * torch.rand(M, K, generator=torch.Generator().manual_seed(11)) - 1)).to(torch_dtype)
    b = (100 * (2 * torch.rand(N, K, generator=torch.Generator().manual_seed(12)) - 1)).to(torch_dtype)
    c = build(fp8_2xacc, M, N, K, 64, 64, 32, dtype, target=target)(a, b)
    assert c.dtype == torch.float32
    assert rel_err(c, a.double() @ b.double().T) < 1e-5


# ----------------------------------------------------------------------------------------------
# the constructs, one at a time


def error_at(fn, factory, fragment: str, *args, target="interpret"):
    """Building ``factory`` fails with ``fragment`` at the line of ``fn`` marked ``# <- error``."""
    with pytest.raises(tilews.CompileError) as info:
        build(factory, *args, target=target)
    e = info.value
    assert fragment in e.message, e.message
    assert e.loc is not None and e.loc.line == marked_line(fn), str(e)
    return e


def test_slice_whose_extent_is_an_expression():
    def f(B, S, H, D, bM):
        @T.prim_func
        def main(Q: T.Tensor((B, S, H, D), T.float16), O: T.Tensor((B, S, H, D), T.float16)):
            with T.Kernel(T.ceildiv(S, bM), H, B, threads=128) as (bx, by, bz):
                Q_s = T.alloc_shared((bM, D), T.float16)
                T.copy(Q[bz, bx * bM:(bx + 1) * bM, by, :], Q_s)
                T.copy(Q_s, O[bz, bx * bM:(bx + 1) * bM, by, :])
        return main
    q = randn(2, 100, 3, 32, dtype=torch.float16, seed=13)      # 100 rows: a masked last tile
    for target in TARGETS:
        assert torch.equal(build(f, 2, 100, 3, 32, 64, target=target)(q), q)


def test_slice_whose_extent_is_not_a_constant():
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(4, threads=128) as bx:
                s = T.alloc_shared((16,), T.float32)
                T.copy(A[bx * 16:(bx + 1) * 32], s)  # <- error
                T.copy(s, B[bx * 16])
        return main
    e = error_at(f, f, "slice (bx * 16):((bx + 1) * 32) of dimension 0 of 'A'", 64)
    assert "not a build-time constant" in e.message


def two_consumers_allocating_in_their_roles(D):
    """Producer T.ws(0) and consumers T.ws(1), T.ws(2): every buffer is allocated inside the
    role block that first uses it; the consumers' private P and accumulators are used again in
    later blocks of the same role, A_s and B1/B2 by other roles."""
    M, K, N = 64, 64, 2 * D

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float16)):
        with T.Kernel(1, threads=384) as bx:
            with T.ws(0):
                ready = T.alloc_barrier(arrive_count=128)
                A_s = T.alloc_shared((M, K), T.float16)
                B1 = T.alloc_shared((K, D), T.float16)
                B2 = T.alloc_shared((K, D), T.float16)
                T.copy(A[0, 0], A_s)
                T.copy(B[0, 0], B1)
                T.copy(B[0, D], B2)
                T.barrier_arrive(ready)
            with T.ws(1):
                acc1 = T.alloc_fragment((M, D), T.float32)
                P1 = T.alloc_shared((M, D), T.float16)
                T.barrier_wait(ready, 0)
                T.gemm(A_s, B1, acc1, clear_accum=True)
            with T.ws(2):
                acc2 = T.alloc_fragment((M, D), T.float32)
                P2 = T.alloc_shared((M, D), T.float16)
                T.barrier_wait(ready, 0)
                T.gemm(A_s, B2, acc2, clear_accum=True)
            with T.ws(1):
                T.copy(acc1, P1)
                T.copy(P1, C[0, 0])
            with T.ws(2):
                T.copy(acc2, P2)
                T.copy(P2, C[0, D])
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_allocations_inside_roles_are_kernel_scoped(target):
    D = 64
    a, b = randn(64, 64, dtype=torch.float16, seed=14), randn(64, 2 * D, dtype=torch.float16, seed=15)
    kernel = build(two_consumers_allocating_in_their_roles, D, target=target)
    assert rel_err(kernel(a, b), gemm_ref(a, b)) < 2e-3
    # every allocation sits with the kernel body's, before the roles
    body = kernel.ir_before.body.stmts
    allocs = [s for s in body if isinstance(s, ir.Alloc)]
    assert len(allocs) == 8 and body[:8] == tuple(allocs)


def test_scalars_bound_inside_roles_stay_scoped():
    def f():
        @T.prim_func
        def main(A: T.Tensor((256,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                s = T.alloc_shared((128,), T.float32)
                with T.ws(0):
                    offset = bx * 128
                    T.copy(A[offset], s)
                with T.ws(1):
                    T.copy(s, A[offset + 128])  # <- error
        return main
    error_at(f, f, "'offset' was assigned inside a runtime loop or branch")


def test_block_wide_step_of_fragments_of_two_roles_is_refused():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64, 64), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                x = T.alloc_fragment((64, 64), T.float32)
                y = T.alloc_fragment((64, 64), T.float32)
                with T.ws(0):
                    T.clear(x)
                with T.ws(1):
                    T.clear(y)
                for i, j in T.Parallel(64, 64):  # <- error
                    x[i, j] = y[i, j]
                with T.ws(0):
                    T.copy(x, A)
        return main
    error_at(f, f, "uses registers of roles T.ws(0) and T.ws(1)")


def test_block_wide_step_orders_the_roles():
    """A statement outside every role: the role that uses what it touches runs it; with two
    users, the other arrives on `ready` before it and waits on `done` after it, at the parity of
    the loop's iteration count (copy_gemm_0_1's copy of A's tile)."""
    def f(n):
        @T.prim_func
        def main(A: T.Tensor((n, 128), T.float32), C: T.Tensor((n, 128), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                s = T.alloc_shared((128,), T.float32)
                for k in T.serial(n):
                    T.copy(A[k, 0], s)
                    with T.ws(1):
                        T.copy(s, C[k, 0])
        return main
    a = randn(5, 128, seed=16)
    for target in TARGETS:
        kernel = build(f, 5, target=target)
        assert torch.equal(kernel(a), a)
    text = kernel.ir_text("before")
    assert "block_step" not in text and "ws(1):\n      copy A" in text
    text = build(ws_copy_gemm_0_1, 128, 128, 192, 64, 64, 32).ir_text("before")
    steps = text[text.index("for ko"):text.index("copy B")]
    assert steps.split("ws(") == [
        steps.split("ws(")[0], "1):\n      barrier_arrive block_step_ready[0]\n    ",
        "0):\n      barrier_wait block_step_ready[0] parity=(ko & 1)\n      copy A[(by * 64):+64, "
        "(ko * 32):+32] -> A_shared[0:+64, 0:+32]\n      barrier_arrive block_step_done[0]\n    ",
        "1):\n      barrier_wait block_step_done[0] parity=(ko & 1)\n    ", "1):\n      "]


@pytest.mark.parametrize("target", TARGETS)
def test_tma_copy_load_and_store(target):
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N, 64), T.float16), B: T.Tensor((N, 64), T.float16)):
            with T.Kernel(T.ceildiv(N, 64), threads=128) as bx:
                s = T.alloc_shared((64, 64), T.float16)
                bar = T.alloc_barrier(arrive_count=128)
                T.tma_copy(A[bx * 64, 0], s, barrier=bar)
                T.barrier_arrive(bar)
                T.barrier_wait(bar, 0)
                T.tma_copy(s, B[bx * 64, 0])
        return main
    a = randn(128, 64, dtype=torch.float16, seed=17)
    assert torch.equal(build(f, 128, target=target)(a), a)


def ops_kernel(op):
    """A kernel whose body calls ``op(A, s, f, bar)``: a global tensor, a shared tile, a fragment
    and a barrier."""
    @T.prim_func
    def main(A: T.Tensor((64, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((64, 64), T.float16)
            f = T.alloc_fragment((64, 64), T.float32)
            bar = T.alloc_barrier(arrive_count=128)
            op(A, s, f, bar)  # <- error
    return main


@pytest.mark.parametrize("op,fragment", [
    (lambda A, s, f, bar: T.tma_copy(A[0, 0], s), "needs barrier=..."),
    (lambda A, s, f, bar: T.tma_copy(s, A[0, 0], barrier=bar), "shared to global memory takes no "
                                                                "barrier"),
    (lambda A, s, f, bar: T.tma_copy(A[0, 0], f, barrier=bar), "global -> shared or shared -> "
                                                                "global memory, not global -> "
                                                                "fragment"),
    (lambda A, s, f, bar: T.mbarrier_arrive(mbarrier=bar, cta_id=1), "(thread-block clusters) is "
                                                                      "not supported"),
    (lambda A, s, f, bar: T.gemm(s, s, f, polcy=T.GemmWarpPolicy.FullRow),
     "unexpected keyword argument 'polcy'"),
    (lambda A, s, f, bar: T.gemm(s, s, f, policy=3), "must be a T.GemmWarpPolicy"),
    (lambda A, s, f, bar: T.gemm(s, s, f, k_pack=0), "T.gemm(k_pack=0): must be an int >= 1"),
    (lambda A, s, f, bar: T.use_swizzle(8, order="column"), "order='column') is not supported"),
    (lambda A, s, f, bar: T.atomic_add(A[0, 0], 1.0, memory_order="sequential"),
     "memory_order='sequential'"),
    (lambda A, s, f, bar: T.alloc_shared((64, 64), "float16", "local"),
     "must be 'shared.dyn' or 'shared'"),
    (lambda A, s, f, bar: T.fill(f, T.uint8(256)), "256 is out of range for uint8 [0, 255]"),
    (lambda A, s, f, bar: T.alloc_shared((64, 64), "float17"), "unknown dtype 'float17'"),
], ids=lambda x: "" if callable(x) else x[:40])
def test_errors_name_the_argument(op, fragment):
    error_at(ops_kernel, ops_kernel, fragment, op)


def test_pipelined_takes_tilelang_hints_only():
    def f(N, **hints):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                s = T.alloc_shared((32,), T.float32)
                for k in T.Pipelined(N // 32, **hints):  # <- error
                    T.copy(A[k * 32], s)
                    T.copy(s, B[k * 32])
        return main
    a = randn(128, seed=18)
    hints = dict(num_stages=2, order=[0, 1], stage=[0, 0], group=[[0], [1]], sync=[[0, 1]])
    assert torch.equal(build(f, 128, **hints)(a), a)
    error_at(f, lambda N: f(N, num_stage=2), "unexpected keyword argument 'num_stage'", 128)


def test_loops_serial_vectorized_and_range():
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                acc = T.alloc_local((1,), T.float32)
                acc[0] = 0
                for i in range(N // 4):
                    for j in T.vectorized(4):
                        acc[0] += A[i * 4 + j]
                for i in T.Serial(N):
                    for j in T.Parallel(1):
                        B[i + j] = acc[0] + i
        return main
    a = randn(64, seed=19)
    for target in TARGETS:
        kernel = build(f, 64, target=target)
        torch.testing.assert_close(kernel(a), a.sum() + torch.arange(64.0), rtol=1e-5, atol=1e-5)
    assert kernel.ir_text("before").count("in serial(") == 3


def test_dtypes_are_their_tilelang_names():
    import numpy as np
    assert T.float16 == "float16" and "bfloat16" == T.bfloat16 and T.float32 != "float16"
    assert hash(T.float16) == hash("float16") and {"float16": 1}[T.float16] == 1
    assert str(T.float8_e4m3fn) == "float8_e4m3fn" and f"{T.int32}" == "int32"
    assert getattr(torch, T.bfloat16) is torch.bfloat16
    for spelling, want in [("float", T.float32), ("half", T.float16), (torch.bfloat16, T.bfloat16),
                           (int, T.int32), (float, T.float32), (bool, T.bool),
                           (np.float16, T.float16), (np.dtype("uint8"), T.uint8),
                           ("e4m3_float8", T.float8_e4m3fn), (T.uint32, T.uint32)]:
        assert T.dtype(spelling) is want, spelling
    assert T.float is T.float32 and T.bool is T.boolean
    assert T.dtype("float8_e5m2").as_torch() is torch.float8_e5m2
    assert (T.float16.bits, T.float16.bytes, T.uint64.bits, T.bool.bytes) == (16, 2, 64, 1)
    assert not isinstance(T.dtype, T.DType) and isinstance(T.float16, T.dtype)
    with pytest.raises(ValueError, match="unknown dtype 'float17'"):
        T.dtype("float17")
    assert determine_fp8_type() is T.float8_e4m3fn and determine_fp8_type("e5m2") is T.float8_e5m2
    with pytest.raises(ValueError, match="'e3m4'"):
        determine_fp8_type("e3m4")


@pytest.mark.parametrize("target", TARGETS)
def test_typed_constants_casts_and_string_dtypes(target):
    def f(N, D):
        @T.prim_func
        def main(A: T.Tensor((N,), "float16"), B: T.Tensor((N,), "float"),
                 C: T.Tensor((N,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_fragment((N,), "float")
                m = T.alloc_fragment((N,), "float")
                T.fill(m, -T.infinity("float"))
                for i in T.Parallel(N):
                    a[i] = A[i].astype("float") * T.float32(0.5) + T.Cast("float", D)
                for i in T.Parallel(N):
                    B[i] = T.max(a[i], m[i]) / T.Cast(T.float32, D)
                    C[i] = T.cast(A[i], "int32") + T.int32(T.uint32(1))
        return main
    a = randn(64, dtype=torch.float16, seed=20) * 4
    b, c = build(f, 64, 3, target=target, out_idx=[1, 2])(a)
    torch.testing.assert_close(b, (a.float() * 0.5 + 3) / 3, rtol=1e-6, atol=1e-6)
    assert torch.equal(c, a.float().trunc().int() + 1)


def test_cast_of_a_python_number_is_a_typed_constant():
    def f():
        @T.prim_func
        def main(A: T.Tensor((4,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                for i in T.Parallel(4):
                    A[i] = T.Cast(T.float32, 7) + T.uint32(1)
        return main
    kernel = build(f)
    assert "7.0:f32" in kernel.ir_text("before") and "1:u32" in kernel.ir_text("before")
    assert torch.equal(kernel(), torch.full((4,), 8.0))


def test_use_swizzle_keywords():
    def f(N, **kw):
        @T.prim_func
        def main(A: T.Tensor((N, N), T.float32), B: T.Tensor((N, N), T.float32)):
            with T.Kernel(N // 32, N // 32, threads=128) as (bx, by):
                T.use_swizzle(**kw)
                s = T.alloc_shared((32, 32), T.float32)
                T.copy(A[by * 32, bx * 32], s)
                T.copy(s, B[by * 32, bx * 32])
        return main
    a = randn(128, 128, seed=21)
    on = build(f, 128, panel_size=2)
    off = build(f, 128, panel_size=2, enable=False)
    assert on.ir_before.swizzle_panel == 2 and off.ir_before.swizzle_panel == 0
    assert torch.equal(on(a), a) and torch.equal(off(a), a)


def test_each_role_may_allocate_under_the_same_name():
    def f():
        @T.prim_func
        def main(A: T.Tensor((2, 128), T.float32), B: T.Tensor((2, 128), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                for g in [0, 1]:               # a build-time loop: one role per iteration
                    with T.ws(g):
                        s = T.alloc_shared((128,), T.float32)
                        T.copy(A[g, 0], s)
                        T.copy(s, B[g, 0])
        return main
    a = randn(2, 128, seed=22)
    kernel = build(f)
    assert torch.equal(kernel(a), a)
    assert "alloc s_1: shared" in kernel.ir_text("before")


# ----------------------------------------------------------------------------------------------
# hopper: every acceptance program compiles (Gluon, or triton.language with the reason)


# name -> (factory, args, kwargs, out_idx, the report's target)
HOPPER_CASES = {
    **{name: (f, (1024, 1024, 512, 128, 128, 64), {}, -1, "hopper")
       for name, f in WS_GEMMS.items() if name != "copy_gemm_0_1"},
    # each role copies its own B tile with a plain copy and reads it: no barrier to complete it on
    "copy_gemm_0_1": (ws_copy_gemm_0_1, (1024, 1024, 512, 128, 128, 64), {}, -1,
                      "hopper -> triton"),
    # no roles, no pipelined gemm: nothing to specialize
    "layernorm_fwd": (layernorm_fwd, (1024, 1024), {}, [-3, -2, -1], "hopper -> triton"),
    "layernorm_bwd": (layernorm_bwd, (1024, 1024, 32), {}, [-3], "hopper -> triton"),
    "rms_norm": (rms_norm, (1024, 1024, 1), {}, -1, "hopper -> triton"),
    "rms_norm_splitk": (rms_norm_splitk, (1024, 1024, 1, 512), {}, -1, "hopper -> triton"),
    **{f"mha_fwd_bhsd_causal={c}": (flashattn, (1, 2, 256, 256, 64, c),
                                    dict(block_M=128, block_N=128, num_stages=2, threads=256),
                                    [3], "hopper") for c in (False, True)},
    "fp8_2xacc": (fp8_2xacc, (1024, 1024, 1024, 128, 128, 64, T.float8_e4m3fn), {}, -1, "hopper"),
    "two_consumers_allocating_in_their_roles": (two_consumers_allocating_in_their_roles, (64,), {},
                                                -1, "hopper"),
}


@pytest.mark.parametrize("name", sorted(HOPPER_CASES))
def test_compiles_for_hopper(name):
    factory, args, kwargs, out_idx, route = HOPPER_CASES[name]
    kernel = build(factory, *args, target="hopper", out_idx=out_idx, **kwargs)
    assert kernel.report.target == route, kernel.report.notes
    if route != "hopper":
        assert any("the gluon backend refused the program" in n for n in kernel.report.notes)


@pytest.mark.parametrize("name", ["barrierpipe_stage2", "copy_0_gemm_1", "copy_1_gemm_0"])
def test_warp_specialize_examples_lowered_for_hopper_compute_the_same(name):
    """docs/ws-semantics.md #12: the interpreter's result for the Hopper lowering equals the
    frontend program's under random schedules."""
    from .test_ws_oracle import assert_same_under_schedules
    M, N, K = 128, 128, 192
    a, b = randn(M, K, dtype=torch.float16, seed=1), randn(K, N, dtype=torch.float16, seed=2)
    prim = WS_GEMMS[name](M, N, K, 64, 64, 32)
    assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2,
                                seeds=range(5))
