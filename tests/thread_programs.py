"""Thread-level programs the tests of several targets share, written as TileLang users write
them (``gemv/example_gemv.py``)."""
from __future__ import annotations

import tilews.language as T


def splitk_gemv(N, K, BLOCK_N, reduce_threads, TILE_K=8, vectorized=True, one_writer=False,
                dtype=T.float16, accum_dtype=T.float32):
    """TileLang's split-K GEMV (``splitk_gemv_vectorized``; ``vectorized=False``: ``splitk_gemv``,
    a serial load loop): each row's dot product split over ``reduce_threads`` threads of
    ``TILE_K`` elements per step, summed by atomics into shared memory. There every thread of a
    row stores the row's result (the same value); ``one_writer`` leaves it to thread tk == 0 (a
    benign race ThreadSanitizer would report). The ``# <-`` markers name lines for tests."""
    BLOCK_K = reduce_threads * TILE_K
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
                C_shared[tn] = 0  # <- init
            T.clear(C_accum)
            for bk in T.serial(T.ceildiv(K, BLOCK_K)):
                for k in load_loop(TILE_K):
                    A_local[k] = A[bk * BLOCK_K + tk * TILE_K + k]
                    B_local[k] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk * TILE_K + k]
                for k in T.serial(TILE_K):
                    C_accum[0] += A_local[k].astype(accum_dtype) * B_local[k].astype(accum_dtype)
            T.atomic_add(C_shared[tn], C_accum[0])  # <- atomic
            if not one_writer or tk == 0:
                C[bn * BLOCK_N + tn] = C_shared[tn]  # <- read
    return main


def naive_gemv(N, K, BLOCK_N, BLOCK_K, threads=None, dtype=T.float16, accum_dtype=T.float32):
    """TileLang's ``naive_gemv``: thread tn computes row tn of the block; the block stages each K
    step's slice of A and its rows of B in shared memory (every thread writes the same A slice).
    ``threads``: the kernel's (TileLang's default, 128, where not given)."""
    frame = {} if threads is None else {"threads": threads}

    @T.prim_func
    def main(A: T.Tensor((K,), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK_N), **frame) as bn:
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
