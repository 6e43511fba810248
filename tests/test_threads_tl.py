"""The thread level on the ``triton.language`` backend (issue 39).

Numerics on ``target="triton"`` (Triton's CPU interpreter here) against float64 references, random
inputs, outputs poisoned: every GEMV form of TileLang's ``gemv`` example that needs no thread
reduction intrinsic (naive, naive split-K, split-K, split-K vectorized), a per-thread loop whose
trip count comes from a tensor, a per-thread branch writing global memory, per-thread atomic adds
into shared and into global memory.

Compile-only for ``GPUTarget("cuda", 90, 32)`` (the ``tl`` path on Hopper; no GPU needed): the
vectorized split-K GEMV loads B with 128-bit loads, keeps each thread's ``TILE_K`` elements in
that thread (TTGIR layout) and reads them without shuffles or a gather. Those builds run in a
subprocess without ``TRITON_INTERPRET`` (``python -m tests.test_threads_tl compile``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import poisoned, randn

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# programs, written as TileLang's gemv examples write them


def naive_gemv(N, K, BLOCK_N, BLOCK_K, dtype=T.float16, accum_dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((K,), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK_N)) as bn:          # threads=128, TileLang's default
            tn = T.get_thread_binding(0)
            A_shared = T.alloc_shared((BLOCK_K,), dtype)
            B_shared = T.alloc_shared((BLOCK_N, BLOCK_K), dtype)
            C_reg = T.alloc_local((1,), accum_dtype)
            T.clear(C_reg)
            for bk in T.serial(T.ceildiv(K, BLOCK_K)):
                for tk in T.serial(BLOCK_K):
                    A_shared[tk] = A[bk * BLOCK_K + tk]
                    B_shared[tn, tk] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk]
                for tk in T.serial(BLOCK_K):
                    C_reg[0] += A_shared[tk].astype(accum_dtype) * B_shared[tn, tk].astype(accum_dtype)
            C[bn * BLOCK_N + tn] = C_reg[0]
    return main


def naive_splitk_gemv(N, K, BLOCK_N, BLOCK_K, dtype=T.float16, accum_dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((K,), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK_N), threads=(BLOCK_N, BLOCK_K)) as bn:
            tn = T.get_thread_binding(0)
            tk = T.get_thread_binding(1)
            A_local = T.alloc_local((1,), dtype)
            B_local = T.alloc_local((1,), dtype)
            C_accum = T.alloc_local((1,), accum_dtype)
            C_shared = T.alloc_shared((BLOCK_N,), accum_dtype)
            if tk == 0:
                C_shared[tn] = 0
            T.clear(C_accum)
            for bk in T.serial(T.ceildiv(K, BLOCK_K)):
                A_local[0] = A[bk * BLOCK_K + tk]
                B_local[0] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk]
                C_accum[0] += A_local[0].astype(accum_dtype) * B_local[0].astype(accum_dtype)
            T.atomic_add(C_shared[tn], C_accum[0])
            C[bn * BLOCK_N + tn] = C_shared[tn]
    return main


def splitk_gemv(N, K, BLOCK_N, BLOCK_K, reduce_threads, vectorized=False, dtype=T.float16,
                accum_dtype=T.float32):
    """TileLang's ``splitk_gemv`` (``vectorized``: ``splitk_gemv_vectorized``, whose caller picks
    ``BLOCK_K = reduce_threads * TILE_K``, TILE_K elements of 128 bits)."""
    TILE_K = T.ceildiv(BLOCK_K, reduce_threads)
    load_loop = T.vectorized if vectorized else T.serial

    @T.prim_func
    def main(A: T.Tensor((K,), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK_N), threads=(BLOCK_N, reduce_threads)) as bn:
            tn = T.get_thread_binding(0)
            tk = T.get_thread_binding(1)
            A_local = T.alloc_local((TILE_K,), dtype)
            B_local = T.alloc_local((TILE_K,), dtype)
            C_shared = T.alloc_shared((BLOCK_N,), accum_dtype)
            C_accum = T.alloc_local((1,), accum_dtype)
            if tk == 0:
                C_shared[tn] = 0
            T.clear(C_accum)
            for bk in T.serial(T.ceildiv(K, BLOCK_K)):
                for k in load_loop(TILE_K):
                    A_local[k] = A[bk * BLOCK_K + tk * TILE_K + k]
                    B_local[k] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk * TILE_K + k]
                for k in T.serial(TILE_K):
                    C_accum[0] += A_local[k].astype(accum_dtype) * B_local[k].astype(accum_dtype)
            T.atomic_add(C_shared[tn], C_accum[0])
            C[bn * BLOCK_N + tn] = C_shared[tn]
    return main


def splitk_gemv_vectorized(N, K, BLOCK_N, reduce_threads, dtype=T.float16):
    TILE_K = 128 // 16
    return splitk_gemv(N, K, BLOCK_N, reduce_threads * TILE_K, reduce_threads, vectorized=True,
                       dtype=dtype)


def ragged_row_sums(R, W, threads=64):
    """Thread t sums the first ``counts[t]`` elements of row t: a loop whose trip count each
    thread reads from a tensor."""
    @T.prim_func
    def main(X: T.Tensor((R, W), T.float32), counts: T.Tensor((R,), T.int32),
             Y: T.Tensor((R,), T.float32)):
        with T.Kernel(T.ceildiv(R, threads), threads=threads) as bx:
            tx = T.get_thread_binding(0)
            acc = T.alloc_var(T.float32)
            acc = 0.0
            for i in T.serial(counts[bx * threads + tx]):
                acc += X[bx * threads + tx, i]
            Y[bx * threads + tx] = acc
    return main


def branch_writes(N, threads=128):
    """Each thread writes either ``2x`` or ``-x`` to its element, by the sign of its input, and
    odd threads also write a flag: branches on per-thread conditions storing to global memory."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((N,), T.float32),
             F: T.Tensor((N,), T.int32)):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            tx = T.get_thread_binding(0)
            i = bx * threads + tx
            if X[i] > 0:
                Y[i] = X[i] * 2.0
            else:
                Y[i] = -X[i]
            if tx % 2 == 1:
                F[i] = tx
            else:
                F[i] = -1
    return main


def histogram(N, BINS, threads=128):
    """Per-thread atomic adds: each thread adds its value into a shared bin picked by its label
    (a scatter-add several threads hit at once), then the block adds its bins into global ones;
    each thread also adds its value into a global total."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), L: T.Tensor((N,), T.int32),
             H: T.Tensor((BINS,), T.float32), S: T.Tensor((1,), T.float32)):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            tx = T.get_thread_binding(0)
            bins = T.alloc_shared((BINS,), T.float32)
            if tx < BINS:
                bins[tx] = 0
            T.atomic_add(bins[L[bx * threads + tx]], X[bx * threads + tx])
            if tx < BINS:
                T.atomic_add(H[tx], bins[tx])
            T.atomic_add(S[0], X[bx * threads + tx])
    return main


# ----------------------------------------------------------------------------------------------
# numerics on target="triton"


def _gemv_ref(A, B):
    return B.double() @ A.double()


GEMVS = {
    "naive": lambda N, K: naive_gemv(N, K, 128, 32),
    "naive_splitk": lambda N, K: naive_splitk_gemv(N, K, 32, 32),
    "splitk": lambda N, K: splitk_gemv(N, K, 32, 32, 8),
    "splitk_vectorized": lambda N, K: splitk_gemv_vectorized(N, K, 2, 32),
}


@pytest.mark.parametrize("form", sorted(GEMVS))
def test_gemv_forms(form):
    N, K = 256, 512
    kernel = tilews.compile(GEMVS[form](N, K), target="triton")
    A, B = randn(K, dtype=torch.float16, seed=1), randn(N, K, dtype=torch.float16, seed=2)
    C = poisoned(N, dtype=torch.float16)
    kernel(A, B, C)
    ref = _gemv_ref(A, B)
    # fp16 output of fp32 sums of K=512 products: the output's rounding dominates
    torch.testing.assert_close(C.double(), ref, rtol=2e-3, atol=2e-2)


def test_ragged_per_thread_loop():
    R, W = 100, 40
    X = randn(R, W, seed=3)
    counts = torch.randint(0, W + 1, (R,), generator=torch.Generator().manual_seed(4),
                           dtype=torch.int32)
    Y = poisoned(R)
    tilews.compile(ragged_row_sums(R, W), target="triton")(X, counts, Y)
    ref = torch.stack([X[r, :counts[r]].double().sum() for r in range(R)])
    torch.testing.assert_close(Y.double(), ref, rtol=1e-5, atol=1e-5)


def test_per_thread_branch_writes_global():
    N = 300
    X = randn(N, seed=5)
    Y, F = poisoned(N), poisoned(N, dtype=torch.int32)
    tilews.compile(branch_writes(N), target="triton")(X, Y, F)
    torch.testing.assert_close(Y.double(), torch.where(X > 0, 2 * X.double(), -X.double()))
    t = torch.arange(N) % 128
    assert torch.equal(F, torch.where(t % 2 == 1, t, -1).to(torch.int32))


def test_per_thread_atomics_into_shared_and_global():
    N, BINS = 384, 8
    X = randn(N, seed=6)
    L = torch.randint(0, BINS, (N,), generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    H, S = torch.zeros(BINS), torch.zeros(1)
    tilews.compile(histogram(N, BINS), target="triton")(X, L, H, S)
    ref = torch.zeros(BINS, dtype=torch.float64).index_add_(0, L.long(), X.double())
    torch.testing.assert_close(H.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S.double(), X.double().sum().reshape(1), rtol=1e-5, atol=1e-4)
