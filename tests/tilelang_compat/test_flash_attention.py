"""TileLang's ``flash_attention/example_mha_fwd_bshd.py`` and ``example_mha_fwd_bhsd.py``:
factory-style attention forward kernels under ``@autotune`` stacked on
``@tilelang.jit(out_idx=[3], pass_configs={PassConfigKey.TL_ENABLE_FAST_MATH: True})``. Called with
explicit block sizes the tuner is bypassed; called without, it tunes over ``get_configs()``. Both
layouts run causal and not; bhsd has a KV sequence longer than the query's (a past prefix)
and, beyond the examples, lengths that are no multiple of the tile."""
import functools
import itertools
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import tilews as tilelang
from tilews.autotuner import *  # noqa: F403  (the examples' spelling; brings `autotune`)
import tilews.language as T


def get_configs():
    iter_params = dict(block_M=[32], block_N=[32], num_stages=[1], threads=[128])
    return [dict(zip(iter_params, values)) for values in itertools.product(*iter_params.values())]


@functools.cache
def flashattn_bshd_for(target: str):

    @autotune(configs=get_configs(), warmup=10, rep=10)  # noqa: F405
    @tilelang.jit(out_idx=[3], pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True},
                  target=target)
    def flashattn(batch, heads, seq_len, dim, is_causal, block_M=64, block_N=64, num_stages=1,
                  threads=128):
        scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
        shape = [batch, seq_len, heads, dim]
        dtype = T.float16
        accum_dtype = T.float32

        @T.prim_func
        def main(
            Q: T.Tensor(shape, dtype),
            K: T.Tensor(shape, dtype),
            V: T.Tensor(shape, dtype),
            Output: T.Tensor(shape, dtype),
        ):
            with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
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

                T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
                T.fill(acc_o, 0)
                T.fill(logsum, 0)
                T.fill(scores_max, -T.infinity(accum_dtype))

                loop_range = (
                    T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N))
                    if is_causal else T.ceildiv(seq_len, block_N)
                )

                for k in T.Pipelined(loop_range, num_stages=num_stages):
                    T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_shared)
                    if is_causal:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0,
                                                         -T.infinity(acc_s.dtype))
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len,
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
                    T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] /= logsum[i]
                T.copy(acc_o, O_shared)
                T.copy(O_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])

        return main

    return flashattn


@functools.cache
def flashattn_bhsd_for(target: str):

    @autotune(configs=get_configs(), warmup=10, rep=10)  # noqa: F405
    @tilelang.jit(out_idx=[3], pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True},
                  target=target)
    def flashattn(batch, heads, seq_q, seq_kv, dim, is_causal, block_M=64, block_N=64,
                  num_stages=1, threads=128):
        scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
        q_shape = [batch, heads, seq_q, dim]
        kv_shape = [batch, heads, seq_kv, dim]
        dtype = T.float16
        accum_dtype = T.float32

        past_len = seq_kv - seq_q
        assert past_len >= 0, "seq_kv must be greater than or equal to seq_q"

        @T.prim_func
        def main(
            Q: T.Tensor(q_shape, dtype),
            K: T.Tensor(kv_shape, dtype),
            V: T.Tensor(kv_shape, dtype),
            Output: T.Tensor(q_shape, dtype),
        ):
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
                    if is_causal else T.ceildiv(seq_kv, block_N)
                )

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

    return flashattn


def ref_program_bshd(Q, K, V, is_causal):
    dim = Q.size(-1)
    scores = torch.einsum("bqhd,bkhd->bhqk", Q, K)
    scores = scores / torch.sqrt(torch.tensor(dim, dtype=scores.dtype))
    if is_causal:
        seq_len = Q.size(1)
        mask = torch.tril(torch.ones(seq_len, seq_len, device=scores.device))
        scores = scores.masked_fill(mask.unsqueeze(0).unsqueeze(0) == 0, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", F.softmax(scores, dim=-1), V)


def ref_program_bhsd(Q, K, V, is_causal):
    dim = Q.size(-1)
    scores = torch.einsum("bhqd,bhkd->bhqk", Q, K)
    scores = scores / torch.sqrt(torch.tensor(dim, dtype=scores.dtype))
    if is_causal:
        seq_q, seq_kv = Q.size(2), K.size(2)
        mask = torch.tril(torch.ones(seq_q, seq_kv, device=scores.device), seq_kv - seq_q)
        scores = scores.masked_fill(mask.unsqueeze(0).unsqueeze(0) == 0, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", F.softmax(scores, dim=-1), V)


CAUSAL = pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])


@CAUSAL
def test_mha_fwd_bshd(target, is_causal):
    """The example's untuned ``main``: explicit block sizes bypass the tuner; the profiler checks
    against the reference and times both. block_N < block_M makes the causal loop bound cut."""
    batch, heads, seq_len, dim = 1, 2, 128, 32
    kernel = flashattn_bshd_for(target)(batch, heads, seq_len, dim, is_causal, block_M=64,
                                        block_N=32, num_stages=1, threads=128)
    assert kernel.latency is None and kernel.config is None
    ref_program_processed = partial(ref_program_bshd, is_causal=is_causal)
    profiler = kernel.get_profiler()
    profiler.assert_allclose(ref_program_processed, rtol=0.01, atol=0.01)
    assert profiler.do_bench(ref_program_processed, warmup=5) > 0
    assert profiler.do_bench(warmup=5) > 0


@CAUSAL
@pytest.mark.parametrize("seq_q, seq_kv", [(64, 128), (100, 100)], ids=["past", "ragged"])
def test_mha_fwd_bhsd(target, is_causal, seq_q, seq_kv):
    """As bshd, with 64 queries attending to 128 keys (a 64-key past prefix), and beyond the
    example with 100 queries and keys (the last query and key tiles partly outside)."""
    batch, heads, dim = 1, 2, 32
    kernel = flashattn_bhsd_for(target)(batch, heads, seq_q, seq_kv, dim, is_causal, block_M=32,
                                        block_N=32, num_stages=1, threads=128)
    assert kernel.latency is None and kernel.config is None
    profiler = kernel.get_profiler()
    profiler.assert_allclose(partial(ref_program_bhsd, is_causal=is_causal), rtol=0.01, atol=0.01)
    assert profiler.do_bench(warmup=5) > 0


def test_mha_fwd_bshd_tuned(target):
    """The example's ``--tune`` path: no block sizes, so the tuner runs ``get_configs()`` and
    returns the best kernel carrying ``latency`` and ``config``."""
    batch, heads, seq_len, dim = 1, 1, 64, 32
    best_result = flashattn_bshd_for(target)(batch, heads, seq_len, dim, True)
    assert best_result.latency > 0
    assert best_result.config == get_configs()[0]
    best_result.get_profiler().assert_allclose(partial(ref_program_bshd, is_causal=True),
                                               rtol=0.01, atol=0.01)


def test_autotune_spellings_agree():
    """``tilelang.autotune`` and the star-imported ``autotune`` are one decorator."""
    assert tilelang.autotune is autotune  # noqa: F405
