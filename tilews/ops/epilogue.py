"""GEMM with a fused epilogue as a ready-made op: C = activation(alpha * (A @ B) + bias).

The epilogue is fragment math after the main loop; on Hopper it runs in the wgmma accumulator's
registers in the consumer warp groups (the tile is then stored by TMA), and under automatic
persistence it overlaps the next tile's loads, like a plain GEMM.
"""
from __future__ import annotations

import torch

import tilews
import tilews.language as T
from tilews.lowering import dtypes

EPILOGUES = ("none", "relu", "gelu", "silu")
GELU_C = 0.7978845608028654                      # sqrt(2 / pi), GELU's tanh approximation


def check_activation(activation) -> None:
    if activation not in EPILOGUES:
        raise ValueError(f"activation must be one of {', '.join(EPILOGUES)}, got {activation!r}")


@tilews.jit(out_idx=[-1])
def matmul_epilogue(M, N, K, activation="relu", alpha=1.0, block_M=128, block_N=256, block_K=64,
                    num_stages=3, threads=256, dtype=T.bfloat16, accum=T.float32):
    """C = activation(alpha * (A @ B) + bias), the epilogue fused into the GEMM's consumer
    (on Hopper it runs in the wgmma accumulator's registers, then the tile is stored by TMA).
    ``gelu`` is GELU's tanh form (``torch.nn.functional.gelu(x, approximate="tanh")``)."""
    check_activation(activation)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), Bias: T.Tensor((N,), dtype),
             C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f)
            for i, j in T.Parallel(block_M, block_N):
                x = C_f[i, j] * alpha + Bias[bx * block_N + j]
                if activation == "relu":
                    x = T.max(x, 0)
                elif activation == "gelu":       # 0.5 x (1 + tanh(u)) = x (1 - 1 / (exp(2u) + 1))
                    u = GELU_C * (x + 0.044715 * x * x * x)
                    x = x - x / (T.exp(2 * u) + 1)
                elif activation == "silu":
                    x = x / (1 + T.exp(-x))
                C_f[i, j] = x
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


_OPERAND_DTYPES = (torch.float16, torch.bfloat16)
# each activation in torch (float32): the result where K == 0 leaves only the bias
_EPILOGUE_OF = {"none": lambda x: x.clone(), "relu": torch.relu,
                "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                "silu": torch.nn.functional.silu}


def matmul_bias_act(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, activation: str = "relu",
                    alpha: float = 1.0) -> torch.Tensor:
    """activation(alpha * (a @ b) + bias) for fp16/bf16 a [M, K], b [K, N], bias [N]. A zero M or
    N gives an empty result, K == 0 activation(bias) in every row (as ``tilews.ops.matmul``).
    No autograd yet: an input that requires grad (in grad mode) is a ``NotImplementedError``."""
    for name, t, dims in (("a", a, 2), ("b", b, 2), ("bias", bias, 1)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            raise ValueError(f"matmul_bias_act(): '{name}' must be a {dims}-d tensor")
        if t.dtype != a.dtype or t.dtype not in _OPERAND_DTYPES:
            raise TypeError(f"matmul_bias_act(): '{name}' is {t.dtype}; a, b and bias must all be "
                            f"float16 or all bfloat16")
    check_activation(activation)
    (M, K), (K2, N) = a.shape, b.shape
    if K2 != K or bias.shape[0] != N:
        raise ValueError(f"matmul_bias_act(): shapes a {tuple(a.shape)}, b {tuple(b.shape)}, bias "
                         f"{tuple(bias.shape)} do not chain (a [M, K], b [K, N], bias [N])")
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or bias.requires_grad):
        raise NotImplementedError("matmul_bias_act(): autograd is not supported yet; an input "
                                  "requires grad (detach it, or run under torch.no_grad())")
    if M == 0 or N == 0 or K == 0:       # as tilews.ops.matmul: empty, or act(0 * alpha + bias)
        return _EPILOGUE_OF[activation](bias.float().expand(M, N)).to(a.dtype)
    kernel = matmul_epilogue(M, N, K, activation, float(alpha), dtype=dtypes.from_torch(a.dtype),
                             **blocks(gpu=a.device.type == "cuda"))
    return kernel(a, b, bias)


def blocks(gpu: bool) -> dict:
    """The tile sizes and threads ``matmul_bias_act`` uses."""
    if gpu:
        return dict(block_M=128, block_N=256, block_K=64, threads=256)
    return dict(block_M=64, block_N=64, block_K=32, threads=128)
