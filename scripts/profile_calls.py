"""Where the host time of a cached call goes: cProfile of back-to-back calls on a GPU.

    python scripts/profile_calls.py [--calls N]

Profiles ``tilews.ops.matmul`` at 1 x 4096 x 4096 bf16 (split-K: two kernels per call) and at
64 x 64 x 64, prints the functions with the most own time, and times the pieces a call cannot
avoid (``torch.empty`` of the output) and ``torch.matmul`` for comparison; then
``tilews.ops.decode_attention`` at B1 H32/8 S8192 D128 bf16 (ragged: the split and the combine
kernel) against SDPA (cuDNN, as launched).
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
    profile_decode(args.calls)


def profile_decode(calls: int) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tilews.ops as ops
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(s, generator=g, device="cuda").bfloat16()
               for s in ((1, 1, 32, 128), (1, 8192, 8, 128), (1, 8192, 8, 128)))
    lengths = torch.full((1,), 8192, dtype=torch.int32, device="cuda")
    call = lambda: ops.decode_attention(q, k, v, lengths)       # noqa: E731
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        sdpa = per_call_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), calls)
    print(f"\n== ops.decode_attention B1 H32/8 S8192 D128: {per_call_us(call, calls):.1f} us per call; "
          f"SDPA cuDNN {sdpa:.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
