"""Probe: the host cost of a cached call with the launch itself stubbed out, on any machine.

Times (7 rounds of 20,000 calls, median microseconds per call) the two cached paths a program
takes again and again: calling a compiled kernel (``kernel(a, b)``: argument check, output
allocation, tilews's launch guard; the interpreter's launch replaced by a no-op) and a factory
call that finds its kernel in the memo (``matmul(**SHAPE)``), on the README's GEMM
(``examples/gemm.py``). Run it under two checkouts to compare them.

    PYTHONPATH=$PWD python scripts/probe_call_cost.py [label]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import tilews
from tilews.lowering.interpreter import backend as interpreter

from examples.gemm import matmul as gemm_example

ROUNDS, CALLS = 7, 20000


# the README's GEMM (examples/gemm.py) on the interpreter, 64x64x32 tiles
matmul = tilews.jit(out_idx=[-1], target="interpret")(gemm_example.fn)
SHAPE = dict(M=64, N=64, K=64, block_M=64, block_N=64, block_K=32, num_stages=2)


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
    kernel = matmul(**SHAPE)
    times = {"kernel call": per_call_us(lambda: kernel(a, b)),
             "factory memo hit": per_call_us(lambda: matmul(**SHAPE))}
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    print(label, {name: round(us, 2) for name, us in times.items()})


if __name__ == "__main__":
    main()
