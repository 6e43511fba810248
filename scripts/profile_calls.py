"""Where the host time of a cached call goes: cProfile of back-to-back calls on a GPU.

    python scripts/profile_calls.py [--calls N]

Profiles ``tilews.ops.matmul`` at 1 x 4096 x 4096 bf16 (split-K: two kernels per call) and at
64 x 64 x 64, prints the functions with the most own time, and times the pieces a call cannot
avoid (``torch.empty`` of the output) and ``torch.matmul`` for comparison.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import tilews.ops as ops
    for M, N, K in ((1, 4096, 4096), (64, 64, 64)):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        call = lambda: ops.matmul(a, b)       # noqa: E731
        print(f"\n== ops.matmul {M}x{N}x{K}: {per_call_us(call, args.calls):.1f} us per call; "
              f"torch.matmul {per_call_us(lambda: torch.matmul(a, b), args.calls):.1f} us; "
              f"torch.empty of the output "
              f"{per_call_us(lambda: torch.empty(M, N, device='cuda', dtype=torch.bfloat16), args.calls):.1f} us")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
