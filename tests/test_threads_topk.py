"""A per-thread top-k (each thread keeps the k largest of its row in registers, inserting each
element by a pass of compare-and-swap: per-thread branches, locals indexed by a loop, values
carried between iterations), on every CPU target, against torch.topk."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import poisoned, randn


def row_topk(M, N, K, threads=32):
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), V: T.Tensor((M, K), T.float32),
             I: T.Tensor((M, K), T.int32)):
        with T.Kernel(T.ceildiv(M, threads), threads=threads) as bx:
            tx = T.get_thread_binding()
            row = bx * threads + tx
            vals = T.alloc_local((K,), T.float32)
            idx = T.alloc_local((K,), T.int32)
            cur_v = T.alloc_var(T.float32)
            cur_i = T.alloc_var(T.int32)
            for j in T.serial(K):
                vals[j] = -T.infinity(T.float32)
                idx[j] = -1
            if row < M:
                for n in T.serial(N):
                    cur_v = X[row, n]
                    cur_i = n
                    for j in T.serial(K):
                        if cur_v > vals[j]:
                            held_v = vals[j]
                            held_i = idx[j]
                            vals[j] = cur_v
                            idx[j] = cur_i
                            cur_v = held_v
                            cur_i = held_i
                for j in T.serial(K):
                    V[row, j] = vals[j]
                    I[row, j] = idx[j]
    return main


TARGETS = ["interpret", "triton", "metal"]


@pytest.mark.parametrize("target", TARGETS)
def test_per_thread_top_k(target):
    M, N, K = 40, 24, 5                  # a partial last block of rows
    x = randn(M, N, seed=11)
    v, i = poisoned(M, K), torch.full((M, K), -7, dtype=torch.int32)
    try:
        kern = tilews.compile(row_topk(M, N, K), target=target)
    except tilews.targets.TargetUnavailable as e:   # pragma: no cover - no C++ compiler
        pytest.skip(str(e))
    kern(x, v, i)
    want = torch.topk(x, K, dim=1)
    assert torch.equal(v, want.values)
    assert torch.equal(i.long(), want.indices)
