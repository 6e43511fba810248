"""Attention backward (FlashAttention-2's algorithm) written in the tile language: three kernels
behind ``tilews.ops.attention``'s autograd.

1. ``preprocess``: ``Delta = rowsum(dO * O)`` per query row, and dQ's float32 accumulator zeroed.
2. ``main``: one block per K/V block (``block_M`` keys) of one KV head. K and V stay in shared
   memory; a ``T.Pipelined`` loop runs over the query blocks (``block_N`` queries) of every query
   head the KV head serves (GQA: ``group`` heads in turn, so dK and dV of a KV head sum all of
   them in registers, no atomics). Per query block: ``S^T = K Q^T``, ``P^T = exp2(S^T * scale -
   LSE)`` (the forward's base-2 log-sum-exp), ``dP^T = V dO^T``, ``dV += P^T dO``,
   ``dS^T = P^T (dP^T - Delta) / sqrt(D)``, ``dK += dS^T Q``, and ``dQ += dS K`` added into
   float32 as a tile (dS^T goes through shared memory: the gemm reads it transposed; dQ's tile
   goes through shared memory too, and on Hopper its add is one bulk reduce-add: element
   atomics from registers cost a third of the kernel's time on an H200).
   Causal: query blocks before the K/V block's first key are skipped; a mask runs only on the
   blocks that cross the diagonal.
3. ``postprocess``: dQ cast to the operands' dtype.

The row vectors (LSE, Delta) and dQ's accumulator have ``rows`` rows per head (whole forward query
blocks): rows past the sequence's end hold finite values (zero Q / O / dO rows), so no kernel needs
a mask for them, and their dQ rows are never read back. Every program takes BHSD tensors;
``tilews.ops.attention`` passes BSHD tensors as transposed views.

On Hopper the main kernel is warp-specialized by the compiler: a TMA producer fills a ring of
Q / dO / LSE / Delta slots, one merged consumer role of two warp groups splits the K/V block's
rows (dK, dV and the S^T / dP^T tiles), and the dQ product splits its columns.
"""
from __future__ import annotations

import math

import torch

import tilews
import tilews.language as T
from tilews.lowering import dtypes

from .attention import LOG2E, operand_sizes


def bwd_preprocess_program(batch, heads, seq_len, dim, rows, block=64, threads=128, dtype=T.float16):
    """``Delta[b, h, r] = sum_d O[b, h, r, d] * dO[b, h, r, d]`` for the ``rows`` rows of each head
    (zero past ``seq_len``), and ``dQ`` (float32, ``rows`` rows) set to zero."""
    shape = [batch, heads, seq_len, dim]
    f32 = T.float32

    @T.prim_func
    def main(O: T.Tensor(shape, dtype), dO: T.Tensor(shape, dtype),
             Delta: T.Tensor([batch, heads, rows], f32), dQ: T.Tensor([batch, heads, rows, dim], f32)):
        with T.Kernel(T.ceildiv(rows, block), heads, batch, threads=threads) as (bx, by, bz):
            o = T.alloc_fragment([block, dim], dtype)
            do = T.alloc_fragment([block, dim], dtype)
            prod = T.alloc_fragment([block, dim], f32)
            delta = T.alloc_fragment([block], f32)
            T.copy(O[bz, by, bx * block, 0], o)
            T.copy(dO[bz, by, bx * block, 0], do)
            for i, j in T.Parallel(block, dim):
                prod[i, j] = T.cast(o[i, j], f32) * T.cast(do[i, j], f32)
            T.reduce_sum(prod, delta, dim=1)
            T.copy(delta, Delta[bz, by, bx * block])
            T.clear(prod)
            T.copy(prod, dQ[bz, by, bx * block, 0])
    return main


def bwd_program(batch, heads, kv_heads, seq_len, dim, is_causal, rows, block_M=128, block_N=64,
                num_stages=2, threads=256, dtype=T.float16):
    """dK and dV of each K/V block (written), dQ added into its float32 accumulator (module
    docstring)."""
    group = heads // kv_heads
    sm_scale = 1.0 / math.sqrt(dim)
    scale = sm_scale * LOG2E
    shape, kv_shape = [batch, heads, seq_len, dim], [batch, kv_heads, seq_len, dim]
    q_blocks = T.ceildiv(seq_len, block_N)
    f32 = T.float32

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
             dO: T.Tensor(shape, dtype), LSE: T.Tensor([batch, heads, rows], f32),
             Delta: T.Tensor([batch, heads, rows], f32), dQ: T.Tensor([batch, heads, rows, dim], f32),
             dK: T.Tensor(kv_shape, dtype), dV: T.Tensor(kv_shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), kv_heads, batch, threads=threads) as (bx, by, bz):
            K_s = T.alloc_shared([block_M, dim], dtype)
            V_s = T.alloc_shared([block_M, dim], dtype)
            Q_s = T.alloc_shared([block_N, dim], dtype)
            dO_s = T.alloc_shared([block_N, dim], dtype)
            dsT_s = T.alloc_shared([block_M, block_N], dtype)
            dq_s = T.alloc_shared([block_N, dim], f32)
            lse = T.alloc_fragment([block_N], f32)
            delta = T.alloc_fragment([block_N], f32)
            sT = T.alloc_fragment([block_M, block_N], f32)
            dpT = T.alloc_fragment([block_M, block_N], f32)
            pT = T.alloc_fragment([block_M, block_N], dtype)
            dsT = T.alloc_fragment([block_M, block_N], dtype)
            dk = T.alloc_fragment([block_M, dim], f32)
            dv = T.alloc_fragment([block_M, dim], f32)
            dq = T.alloc_fragment([block_N, dim], f32)

            T.copy(K[bz, by, bx * block_M, 0], K_s)
            T.copy(V[bz, by, bx * block_M, 0], V_s)
            T.clear(dk)
            T.clear(dv)
            first = (bx * block_M) // block_N if is_causal else 0
            per_head = q_blocks - first
            for it in T.Pipelined(group * per_head, num_stages=num_stages):
                h = by * group + it // per_head if group > 1 else by
                kb = first + it % per_head if group > 1 else first + it
                T.copy(Q[bz, h, kb * block_N, 0], Q_s)
                T.copy(LSE[bz, h, kb * block_N], lse)
                T.gemm(K_s, Q_s, sT, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(block_M, block_N):
                    sT[i, j] = T.exp2(sT[i, j] * scale - lse[j])
                if is_causal:
                    # keys after the query: only in blocks that cross the diagonal
                    if kb * block_N < bx * block_M + block_M - 1:
                        for i, j in T.Parallel(block_M, block_N):
                            sT[i, j] = T.if_then_else(bx * block_M + i <= kb * block_N + j, sT[i, j], 0)
                T.copy(dO[bz, h, kb * block_N, 0], dO_s)
                T.copy(Delta[bz, h, kb * block_N], delta)
                T.gemm(V_s, dO_s, dpT, transpose_B=True, clear_accum=True)
                T.copy(sT, pT)
                T.gemm(pT, dO_s, dv)
                for i, j in T.Parallel(block_M, block_N):
                    dsT[i, j] = sT[i, j] * (dpT[i, j] - delta[j]) * sm_scale
                T.gemm(dsT, Q_s, dk)
                T.copy(dsT, dsT_s)
                T.gemm(dsT_s, K_s, dq, transpose_A=True, clear_accum=True)
                T.copy(dq, dq_s)
                T.atomic_add(dQ[bz, h, kb * block_N, 0], dq_s)
            T.copy(dv, dV[bz, by, bx * block_M, 0])
            T.copy(dk, dK[bz, by, bx * block_M, 0])
    return main


def bwd_postprocess_program(batch, heads, seq_len, dim, rows, block=64, threads=128, dtype=T.float16):
    """``dQ_out = dQ[:, :, :seq_len]`` in ``dtype``."""
    f32 = T.float32

    @T.prim_func
    def main(dQ: T.Tensor([batch, heads, rows, dim], f32),
             dQ_out: T.Tensor([batch, heads, seq_len, dim], dtype)):
        with T.Kernel(T.ceildiv(seq_len, block), heads, batch, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment([block, dim], f32)
            out = T.alloc_fragment([block, dim], dtype)
            T.copy(dQ[bz, by, bx * block, 0], acc)
            T.copy(acc, out)
            T.copy(out, dQ_out[bz, by, bx * block, 0])
    return main


bwd_preprocess = tilews.jit(bwd_preprocess_program)
bwd = tilews.jit(bwd_program)
bwd_postprocess = tilews.jit(bwd_postprocess_program)


def blocks(dim: int, gpu: bool) -> dict:
    """The main kernel's blocks, threads and ring depth for head dim ``dim``: 128 keys x 64
    queries over two consumer warp groups on a GPU (64 keys above D = 128, where dK and dV of 128
    rows would not fit the registers), 64 x 32 on the CPU's interpreter."""
    if not gpu:
        return dict(block_M=64, block_N=32, threads=128, num_stages=2)
    if dim > 128:
        return dict(block_M=64, block_N=64, threads=256, num_stages=1)
    return dict(block_M=128, block_N=64, threads=256, num_stages=2)


def attention_backward(grad_out, q, k, v, out, lse, is_causal: bool, layout: str):
    """(dq, dk, dv) of ``tilews.ops.attention(q, k, v, is_causal, layout)`` given the output's
    gradient, the output and the forward's base-2 log-sum-exp (``lse``, [batch, heads, rows])."""
    batch, heads, seq_len, dim, kv_heads = operand_sizes(q, k, layout)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if seq_len == 0 or batch == 0 or heads == 0:
        return dq, dk.zero_(), dv.zero_()
    bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
    q, k, v, out, dq, dk, dv = map(bhsd, (q, k, v, out, dq, dk, dv))
    grad_out = bhsd(grad_out.to(q.dtype))
    gpu, dtype, rows = q.device.type == "cuda", dtypes.from_torch(q.dtype), lse.shape[-1]
    delta = lse.new_empty(lse.shape)
    dq_acc = lse.new_empty((batch, heads, rows, dim))
    bwd_preprocess(batch, heads, seq_len, dim, rows, dtype=dtype)(out, grad_out, delta, dq_acc)
    bwd(batch, heads, kv_heads, seq_len, dim, is_causal, rows, dtype=dtype,
        **blocks(dim, gpu))(q, k, v, grad_out, lse, delta, dq_acc, dk, dv)
    bwd_postprocess(batch, heads, seq_len, dim, rows, dtype=dtype)(dq_acc, dq)
    return tuple(t if layout == "bhsd" else t.transpose(1, 2) for t in (dq, dk, dv))


@torch.library.custom_op("tilews::attention_backward", mutates_args=(),
                         schema="(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                                "bool is_causal, str layout) -> (Tensor, Tensor, Tensor)")
def _attention_backward_op(grad_out, q, k, v, out, lse, is_causal, layout):
    return attention_backward(grad_out, q, k, v, out, lse, is_causal, layout)


@_attention_backward_op.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, lse, is_causal, layout):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
