"""Row softmax with T.Parallel and reductions (one block of rows per program).

``python examples/softmax.py`` runs it on the best target here and checks it against torch.
"""
from __future__ import annotations

import sys

import torch

import tilews
import tilews.language as T
from tilews.testing import best_device, rel_err, time_ms


@tilews.jit(out_idx=[-1])
def softmax(M, N, block_M=16, dtype=T.float32):
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            x = T.alloc_fragment((block_M, N), T.float32)
            row_max = T.alloc_fragment((block_M,), T.float32)
            row_sum = T.alloc_fragment((block_M,), T.float32)
            T.copy(X[bx * block_M, 0], x)
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = T.exp(x[i, j] - row_max[i])
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = x[i, j] / row_sum[i]
            T.copy(x, Y[bx * block_M, 0])
    return main


def main(argv=None) -> int:
    device = best_device()
    M, N = (8192, 1024) if device.type == "cuda" else (100, 64)
    kernel = softmax(M, N)
    x = torch.randn(M, N, device=device) * 3
    y = kernel(x)
    err = rel_err(y, torch.softmax(x.double(), dim=1))
    ms = time_ms(lambda: kernel(x), device, reps=3)
    print(f"softmax {M}x{N} f32 on target '{kernel.target}': {ms:.3f} ms, rel err {err:.2e}")
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
