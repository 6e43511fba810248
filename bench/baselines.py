"""The "what a Triton user writes" GEMM: the tutorial's ``tl.dot`` kernel, grouped tile order,
masks for ragged shapes, one standard configuration (128x128x64, 3 stages, 8 warps).

K is a ``tl.constexpr`` (one compile per K, as a kernel autotuned on K is): a runtime loop bound
cannot run in Triton 3.6's CPU interpreter under numpy >= 2.4, which no longer turns the
interpreter's one-element scalars into Python ints. That interpreter also multiplies bf16 tiles in
``tl.dot`` as their raw 16-bit patterns, so there (only) the tiles go to float32 first
(``UPCAST``; exact: a bf16 product is exact in float32). On a GPU the branch compiles away.

Importing this module imports triton: on a CPU, ``tilews.bench.machine.triton_unavailable`` must
have switched Triton's interpreter on first.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, NUM_WARPS = 128, 128, 64, 8, 3, 8


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K: tl.constexpr,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_left = K - k
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


INTERPRETED = isinstance(_matmul_kernel, InterpretedFunction)


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """``c = a @ b`` (c preallocated, same dtype as the inputs)."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, UPCAST=INTERPRETED, num_stages=NUM_STAGES,
                         num_warps=NUM_WARPS)
