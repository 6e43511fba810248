"""GEMM: C = A @ B, tiled, pipelined, in the TileLang style.

Run it: ``python examples/gemm.py`` compiles for the best target on this machine, runs, checks
against torch in float64 and prints what ran where and how long it took.
"""
from __future__ import annotations

import sys
import time

import torch

import tilews
import tilews.language as T
from tilews.testing import best_device, rel_err, time_ms


@tilews.jit(out_idx=[-1])
def matmul(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=3, threads=128, swizzle=0,
           dtype=T.float16, accum=T.float32):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if swizzle:
                T.use_swizzle(swizzle)          # visit tiles in panels for L2 reuse
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


@tilews.jit(out_idx=[-1])
def persistent_matmul(M, N, K, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256,
                      num_sms=None, group_size=8, dtype=T.bfloat16, accum=T.float32):
    """One block per SM looping over output tiles in grouped order (T.Persistent): on Hopper the
    producer runs ahead into the next tile's loads while the consumers store this tile."""
    sms = num_sms or tilews.num_sms()

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(sms, threads=threads) as block_id:
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            for bx, by in T.Persistent([T.ceildiv(M, block_M), T.ceildiv(N, block_N)], sms, block_id,
                                       group_size):
                T.clear(C_f)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[bx * block_M, k * block_K], A_s)
                    T.copy(B[k * block_K, by * block_N], B_s)
                    T.gemm(A_s, B_s, C_f)
                T.copy(C_f, C[bx * block_M, by * block_N])
    return main


def main(argv=None) -> int:
    device = best_device()
    # A size that fills a GPU; a small ragged one for the CPU paths (interpreters are slow).
    M, N, K = (4096, 4096, 4096) if device.type == "cuda" else (200, 136, 100)
    # On a GPU: 128x256 tiles for two consumer warp groups (on Hopper, warp specialization adds
    # a producer warp group); on the CPU small tiles.
    blocks = dict(block_M=128, block_N=256, block_K=64, threads=256, swizzle=16) if device.type == "cuda" else \
        dict(block_M=64, block_N=64, block_K=32)
    t0 = time.perf_counter()
    kernel = matmul(M, N, K, **blocks)
    compile_ms = (time.perf_counter() - t0) * 1e3
    a = torch.randn(M, K, device=device).half()
    b = torch.randn(K, N, device=device).half()
    c = kernel(a, b)
    err = rel_err(c, a.double() @ b.double())
    ms = time_ms(lambda: kernel(a, b), device, reps=3)
    tflops = 2 * M * N * K / ms / 1e9
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"gemm {M}x{N}x{K} fp16 on target '{kernel.target}' ({where})")
    print(f"  compile {compile_ms:.0f} ms, run {ms:.3f} ms median"
          + (f" ({tflops:.1f} TFLOP/s)" if device.type == "cuda" else " (CPU interpreter: not a GPU timing)"))
    for note in kernel.report.notes:
        print(f"  note: {note}")
    ok = err < 1e-2
    print(f"  rel err vs float64 torch: {err:.2e} -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
