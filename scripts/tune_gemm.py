"""Time a few warp-specialized GEMM configurations against torch.matmul, interleaved, several
rounds, median ratio per configuration (noise on a shared GPU is a few percent).

    python scripts/tune_gemm.py [M N K]
"""
from __future__ import annotations

import statistics
import sys

import torch

import tilews
import tilews.language as T
from examples.gemm import matmul, persistent_matmul
from examples.ws_gemm import pingpong_matmul_program, ws_ring_matmul_program
from tilews.testing import rel_err, time_ms


def configs(M, N, K):
    hop = lambda f: tilews.jit(out_idx=[-1], target="hopper")(f)  # noqa: E731
    yield "auto 128x256x64 s3 sw8", hop(matmul.fn)(M, N, K, block_M=128, block_N=256, block_K=64,
                                                    num_stages=3, threads=256, swizzle=8, dtype=T.bfloat16)
    yield "auto 128x256x32 s6 sw8", hop(matmul.fn)(M, N, K, block_M=128, block_N=256, block_K=32,
                                                    num_stages=6, threads=256, swizzle=8, dtype=T.bfloat16)
    yield "auto 128x256x64 s3 sw16", hop(matmul.fn)(M, N, K, block_M=128, block_N=256, block_K=64,
                                                     num_stages=3, threads=256, swizzle=16, dtype=T.bfloat16)
    yield "explicit ring s3 sw8", hop(ws_ring_matmul_program)(M, N, K, stages=3)
    yield "explicit ring 128x256x32 s6 sw8", hop(ws_ring_matmul_program)(M, N, K, block_K=32, stages=6)
    yield "persistent 128x256x64 s3", hop(persistent_matmul.fn)(M, N, K, dtype=T.bfloat16)
    yield "persistent 128x256x32 s6", hop(persistent_matmul.fn)(M, N, K, block_K=32, num_stages=6,
                                                               dtype=T.bfloat16)
    yield "ping-pong 128x128x64 s4", hop(pingpong_matmul_program)(M, N, K)


def main(argv) -> None:
    M, N, K = map(int, argv) if argv else (4096, 4096, 4096)
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    ref = a.double() @ b.double()
    kernels = list(configs(M, N, K))
    ratios = {name: [] for name, _ in kernels}
    for name, k in kernels:
        assert k.target == "hopper", (name, k.report.notes)
        assert rel_err(k(a, b), ref) < 1e-2, name
    for _ in range(5):
        for name, k in kernels:
            cublas = time_ms(lambda: a @ b, a.device)
            ratios[name].append(cublas / time_ms(lambda: k(a, b), a.device))
    print(f"{torch.cuda.get_device_name()} {M}x{N}x{K} bf16: median of 5 rounds of ratio to torch.matmul")
    for name, r in ratios.items():
        print(f"| {name} | {statistics.median(r):.3f}x | min {min(r):.3f} max {max(r):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
