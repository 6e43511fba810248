"""Attention forward (FlashAttention's online softmax) as a ready-made op, written in the tile
language as TileLang's own example is (``examples/flash_attention/example_mha_fwd_bhsd.py`` /
``_bshd.py``): the Q tile in shared memory, a ``T.Pipelined`` loop over K/V blocks that keeps the
row maximum and sum and rescales the running output.

On Hopper the compiler splits the program into a TMA producer (Q once, then K and V rings) and
one consumer role per warp group; S = Q K^T, the softmax and P (S cast to 16 bits) stay in
registers, P V reads P as the wgmma's register operand, and P V of one block runs while the
softmax of the next is computed. Causal or not, BHSD or BSHD tensors, any
sequence length (keys past the end are masked, rows past the end are not stored).

``attention(q, k, v, is_causal=False, layout="bhsd")`` checks its arguments (the parameter named
in each error), returns an empty result for a zero-length sequence, and picks blocks for the
device: 128 x 128 blocks, two consumer warp groups and a 2-deep K/V ring on a GPU (at head dims
above 128, 64-row K/V blocks in one stage: more would exceed shared memory), 64 x 64 on the
CPU's interpreter.
"""
from __future__ import annotations

import math

import torch

import tilews
import tilews.language as T
from tilews.lowering import dtypes

LOG2E = 1.4426950408889634


def _dims(batch, heads, seq_len, dim, layout):
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    return [batch, heads, seq_len, dim] if layout == "bhsd" else [batch, seq_len, heads, dim]


def mha_fwd_program(batch, heads, seq_len, dim, is_causal, block_M=128, block_N=128, num_stages=2,
                    threads=256, layout="bhsd", dtype=T.float16):
    scale = LOG2E / math.sqrt(dim)                 # softmax in base 2
    shape = _dims(batch, heads, seq_len, dim, layout)
    accum = T.float32

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bm, by, bz):
            # causal: the longest rows (the last query blocks) start first, so the short ones
            # fill the tail of the schedule instead of leaving one long block running alone
            bx = T.ceildiv(seq_len, block_M) - 1 - bm if is_causal else bm
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum)
            scores_max = T.alloc_fragment([block_M], accum)
            scores_max_prev = T.alloc_fragment([block_M], accum)
            scores_scale = T.alloc_fragment([block_M], accum)
            scores_sum = T.alloc_fragment([block_M], accum)
            logsum = T.alloc_fragment([block_M], accum)

            if layout == "bhsd":
                T.copy(Q[bz, by, bx * block_M, 0], Q_shared)
            else:
                T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum))
            if is_causal:
                loop_range = T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N))
            else:
                loop_range = T.ceildiv(seq_len, block_N)
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                if layout == "bhsd":
                    T.copy(K[bz, by, k * block_N, 0], K_shared)
                else:
                    T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_shared)
                # -inf where a key is past the end (or, causal, after the query), only in the
                # blocks that hold such keys. Causal: S starts as 0 / -inf and Q K^T
                # accumulates into it (TileLang's form: the mask is ready before the gemm is
                # issued). Otherwise the mask is rare (a ragged end), so S = Q K^T is written
                # whole and masked after, with no branch before the gemm. (Measured on an H100
                # in one run, 9 rounds: each form is 0-4% faster where it is used than the other
                # would be. Neither zeroes S: Triton turns the cleared accumulator into the
                # wgmma's run-time use_acc.)
                if is_causal:
                    if (k + 1) * block_N <= T.min(seq_len, bx * block_M + 1):
                        T.clear(acc_s)
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else((bx * block_M + i >= k * block_N + j)
                                                         and (k * block_N + j < seq_len), 0,
                                                         -T.infinity(accum))
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True)
                else:
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, clear_accum=True)
                    if (k + 1) * block_N > seq_len:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(k * block_N + j < seq_len, acc_s[i, j],
                                                         -T.infinity(accum))
                if layout == "bhsd":
                    T.copy(V[bz, by, k * block_N, 0], V_shared)
                else:
                    T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_shared)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.gemm(acc_s_cast, V_shared, acc_o)
            # one division per row, then a multiply per element: an IEEE division per element
            # (div.rn) costs as much as a block's softmax, in an epilogue no gemm hides
            for i in T.Parallel(block_M):
                logsum[i] = 1.0 / logsum[i]
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] *= logsum[i]
            T.copy(acc_o, O_shared)
            if layout == "bhsd":
                T.copy(O_shared, Output[bz, by, bx * block_M, 0])
            else:
                T.copy(O_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])
    return main


mha_fwd = tilews.jit(out_idx=[3])(mha_fwd_program)

_OPERAND_DTYPES = (torch.float16, torch.bfloat16)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              layout: str = "bhsd") -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for 4-d fp16/bf16 tensors of the same shape, [batch, heads,
    seq, D] (``layout="bhsd"``) or [batch, seq, heads, D] (``"bshd"``); causal masks keys after
    the query's position."""
    shape = _check(q, k, v, layout)
    batch, heads, seq_len, dim = shape if layout == "bhsd" else (shape[0], shape[2], shape[1], shape[3])
    if seq_len == 0 or batch == 0 or heads == 0:
        return torch.empty_like(q)
    kernel = mha_fwd(batch, heads, seq_len, dim, bool(is_causal), layout=layout,
                     dtype=dtypes.from_torch(q.dtype), **blocks(dim, gpu=q.device.type == "cuda"))
    return kernel(q, k, v)


def blocks(dim: int, gpu: bool) -> dict:
    """The block sizes, threads and K/V stages ``attention`` uses for head dim ``dim``."""
    if not gpu:
        return dict(block_M=64, block_N=64, threads=128, num_stages=2)
    if dim > 128:        # Q, O and one 64-row K/V stage: 192 KB of the 227 KB
        return dict(block_M=128, block_N=64, threads=256, num_stages=1)
    return dict(block_M=128, block_N=128, threads=256, num_stages=2)


def _check(q, k, v, layout) -> tuple:
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"attention(layout=...) must be 'bhsd' or 'bshd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention(): '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention(): '{name}' must be 4-d ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in _OPERAND_DTYPES:
            raise TypeError(f"attention(): '{name}' must be float16 or bfloat16, got {t.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"attention(): '{name}' has shape {tuple(t.shape)} but 'q' has "
                             f"{tuple(q.shape)}; they must match")
        if t.dtype != q.dtype:
            raise TypeError(f"attention(): '{name}' is {t.dtype} but 'q' is {q.dtype}; they must match")
        if t.device != q.device:
            raise ValueError(f"attention(): '{name}' is on {t.device} but 'q' is on {q.device}")
    return tuple(q.shape)
