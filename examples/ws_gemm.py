"""The explicit warp-specialized GEMM of DESIGN §2: a producer warp group fills shared memory,
ONE consumer role of two warp groups (``T.ws(1, 2)``) multiplies; they hand over through
barriers that count arriving threads.

``python examples/ws_gemm.py`` runs it in the reference interpreter under several schedules (where
races and deadlocks are detected) and on the best target here, checking against torch.
"""
from __future__ import annotations

import sys

import torch

import tilews
import tilews.language as T
from tilews.testing import best_device, rel_err


def ws_matmul_program(M, N, K, block_M=128, block_N=128, block_K=32, dtype=T.float16,
                      accum=T.float32):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            ready = T.alloc_barrier(arrive_count=128)      # the producer warp group arrives
            done = T.alloc_barrier(arrive_count=256)       # both consumer warp groups arrive
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    T.barrier_wait(done, (ko + 1) % 2)
                    T.copy(A[by * block_M, ko * block_K], A_s)
                    T.copy(B[ko * block_K, bx * block_N], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1, 2):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A_s, B_s, C_f)
                    T.barrier_arrive(done)
            with T.ws(1, 2):
                T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def ws_ring_matmul_program(M, N, K, block_M=128, block_N=256, block_K=64, stages=3, swizzle=8,
                           dtype=T.bfloat16, accum=T.float32):
    """The same roles over a ``stages``-deep ring of shared buffers, each slot guarded by a
    full/empty barrier pair (ws-semantics #7): the producer runs up to ``stages`` tiles ahead."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            if swizzle:
                T.use_swizzle(swizzle)          # visit tiles in panels for L2 reuse
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([256] * stages)
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    T.barrier_wait(empty[ko % stages], ((ko // stages) & 1) ^ 1)
                    T.copy(A[by * block_M, ko * block_K], A_s[ko % stages, :, :])
                    T.copy(B[ko * block_K, bx * block_N], B_s[ko % stages, :, :])
                    T.barrier_arrive(full[ko % stages])
                with T.ws(1, 2):
                    T.barrier_wait(full[ko % stages], (ko // stages) & 1)
                    T.gemm(A_s[ko % stages, :, :], B_s[ko % stages, :, :], C_f)
                    T.barrier_arrive(empty[ko % stages])
            with T.ws(1, 2):
                T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def ws_matmul(M, N, K, target="auto", **kw):
    return tilews.jit(out_idx=[-1], target=target)(ws_matmul_program)(M, N, K, **kw)


def main(argv=None) -> int:
    M, N, K = 160, 136, 100
    blocks = dict(block_M=64, block_N=64, block_K=32)
    a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
    ref = a.double() @ b.double()
    ok = True
    for seed in range(3):
        k = tilews.jit(out_idx=[-1], target="interpret", seed=seed)(ws_matmul_program)(M, N, K, **blocks)
        err = rel_err(k(a, b), ref)
        print(f"ws_gemm {M}x{N}x{K} interpreter, schedule seed {seed}: rel err {err:.2e}")
        ok &= err < 1e-2
    device = best_device()
    k = ws_matmul(M, N, K, **blocks)
    err = rel_err(k(a.to(device), b.to(device)), ref)
    print(f"ws_gemm on target '{k.target}': rel err {err:.2e}")
    for note in k.report.notes:
        print(f"  note: {note}")
    ok &= err < 1e-2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
