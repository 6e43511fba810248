"""Probe: the host cost of a cached call with the launch itself stubbed out, on any machine.

Times (7 rounds of 20,000 calls, median microseconds per call) the two cached paths a program
takes again and again: calling a compiled kernel (``kernel(a, b)``: argument check, output
allocation, tilews's launch guard; the interpreter's launch replaced by a no-op) and a factory
call that finds its kernel in the memo (``matmul(64, 64, 64)``). Run it under two checkouts to
compare them.

    python scripts/probe_call_cost.py [label]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import tilews
import tilews.language as T
from tilews.lowering.interpreter import backend as interpreter

ROUNDS, CALLS = 7, 20000


@tilews.jit(out_idx=[-1], target="interpret")
def matmul(M, N, K, block_M=64, block_N=64, block_K=32, dtype=T.float16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def per_call_us(fn) -> float:
    for _ in range(CALLS // 10):
        fn()
    samples = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(samples)


def main() -> None:
    interpreter.InterpreterProgram.launch = lambda self, values: None   # before the compile
    a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
    kernel = matmul(64, 64, 64)
    times = {"kernel call": per_call_us(lambda: kernel(a, b)),
             "factory memo hit": per_call_us(lambda: matmul(64, 64, 64))}
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    print(label, {name: round(us, 2) for name, us in times.items()})


if __name__ == "__main__":
    main()
