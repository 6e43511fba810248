"""Attention over packed sequences of different lengths (FlashAttention's
``flash_attn_varlen_func``): ``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False)``.

q [total_q, heads, D], k and v [total_k, kv_heads, D] (``kv_heads`` dividing ``heads``: GQA),
fp16 / bf16; sequence ``b`` is rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and
``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k and v (int32, ``batch + 1`` entries, from 0).
Causal masks are aligned to the bottom right when a sequence's lengths differ (FlashAttention
2.1 and later): query ``i`` sees keys ``j <= i + len_k - len_q``; a query that sees no key gets a
zero output (and zero gradients). Returns out [total_q, heads, D]; differentiable
(``tilews::attention_varlen``, its backward ``tilews::attention_varlen_backward``: dK and dV of
a KV head sum over its query heads).

The kernels are the dense ones' block bodies (``attention_block``, ``backward_block``,
``preprocess_block``) over a grid of ``ceil(max_seqlen / block)`` x heads x batch; each block
reads its sequence's start and length from ``cu_seqlens``. The batch, the totals and the maximum
lengths are runtime values: one compiled kernel serves every batch of a given head count, head
dim, dtype, causality and scale. The forward keeps the base-2 log-sum-exp per sequence, padded:
[batch, heads, lse_rows(max_seqlen_q, block_M)] float32, sequence ``b``'s row ``r`` at ``[b, :,
r]`` (+inf for a query that sees no key; the rows of query blocks past the sequence's last
are not written); the backward's Delta and float32 dQ have the same rows. Blocks are
``attention``'s and ``attention_backward``'s (``blocks``). On Hopper the forward is persistent
(one block per SM over the query blocks in alternating rounds, as the dense forward).

Arguments are checked with errors naming the parameter; the offsets' values (rising from 0 to the
tensor's rows, no sequence longer than ``max_seqlen``) only where they are on the CPU: on a GPU
they are trusted, as FlashAttention does (reading them back would stall the stream).
"""
from __future__ import annotations

import functools
import math

import torch

import tilews
from tilews.lowering import dtypes

from .attention import blocks as forward_blocks
from .attention import lse_rows, mha_fwd_varlen_program
from .attention_backward import blocks as backward_blocks
from .attention_backward import (bwd_varlen_postprocess_program, bwd_varlen_preprocess_program,
                                 bwd_varlen_program)

_NAME = "attention_varlen()"


@functools.lru_cache(maxsize=None)
def _factory(program, target: str):
    return tilews.jit(out_idx=None, target=target)(program)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                     softmax_scale: float | None = None, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T * softmax_scale) v per packed sequence (module docstring); ``softmax_scale``
    defaults to ``1 / sqrt(D)``."""
    scale = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale,
            bool(causal))
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and
                                         (q.requires_grad or k.requires_grad or v.requires_grad)):
        return torch.ops.tilews.attention_varlen(*args)[0]
    return varlen_forward(*args, store_lse=False)[0]


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: float, causal: bool, store_lse: bool, target: str = "auto"):
    """(out, the base-2 log-sum-exp [batch, heads, rows] or None) of checked arguments."""
    batch, heads, dim = len(cu_seqlens_q) - 1, q.shape[1], q.shape[2]
    out = torch.empty_like(q)
    cfg = forward_blocks(dim, gpu=q.device.type == "cuda")
    rows = lse_rows(max_seqlen_q, cfg["block_M"])
    lse = q.new_empty((batch, heads, rows), dtype=torch.float32) if store_lse else None
    if batch == 0 or max_seqlen_q == 0 or heads == 0:
        return out, lse
    kernel = _factory(mha_fwd_varlen_program, target)(
        heads, k.shape[1], dim, causal, dtype=dtypes.from_torch(q.dtype), store_lse=store_lse,
        sm_scale=softmax_scale, **cfg)
    kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out, *([lse] if store_lse else []))
    return out, lse


def varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_k: int,
                    softmax_scale: float, causal: bool, target: str = "auto"):
    """(dq, dk, dv) of ``attention_varlen`` given the output's gradient, the output and the
    forward's log-sum-exp (``varlen_forward(..., store_lse=True)``)."""
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    batch, heads, dim = lse.shape[0], q.shape[1], q.shape[2]
    rows = lse.shape[2]
    if batch == 0 or rows == 0 or heads == 0:
        return dq.zero_(), dk, dv
    dtype, grad_out = dtypes.from_torch(q.dtype), grad_out.to(q.dtype).contiguous()
    delta = lse.new_empty(lse.shape)
    dq_acc = lse.new_empty((batch, heads, rows, dim))
    _factory(bwd_varlen_preprocess_program, target)(heads, dim, dtype=dtype)(
        out, grad_out, cu_seqlens_q, delta, dq_acc)
    if max_seqlen_k:
        _factory(bwd_varlen_program, target)(
            heads, k.shape[1], dim, causal, dtype=dtype, sm_scale=softmax_scale,
            **backward_blocks(dim, q.device.type == "cuda", varlen=True))(
            q, k, v, grad_out, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, lse, delta, dq_acc, dk, dv)
    _factory(bwd_varlen_postprocess_program, target)(heads, dim, dtype=dtype)(dq_acc, cu_seqlens_q, dq)
    return dq, dk, dv


def _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale) -> float:
    """The softmax scale, after checking every argument (errors name the parameter)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{_NAME}: '{name}' must be 3-d [total, heads, D], got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{_NAME}: '{name}' must be float16 or bfloat16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{_NAME}: '{name}' is {t.dtype} but 'q' is {q.dtype}; they must match")
        if t.device != q.device:
            raise ValueError(f"{_NAME}: '{name}' is on {t.device} but 'q' is on {q.device}")
        if not t.is_contiguous():
            raise ValueError(f"{_NAME}: '{name}' must be contiguous")
    heads, kv_heads = q.shape[1], k.shape[1]
    if v.shape != k.shape or k.shape[2] != q.shape[2] or not kv_heads or heads % kv_heads:
        raise ValueError(f"{_NAME}: 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must have one "
                         f"shape [total_k, kv_heads, D], D that of 'q' {tuple(q.shape)} and "
                         f"kv_heads dividing its heads")
    for name, cu, t, longest, total in (
            ("cu_seqlens_q", cu_seqlens_q, q, max_seqlen_q, "q"),
            ("cu_seqlens_k", cu_seqlens_k, k, max_seqlen_k, "k")):
        if cu.dtype != torch.int32 or cu.dim() != 1 or len(cu) < 1:
            raise ValueError(f"{_NAME}: '{name}' must be a 1-d int32 tensor of batch + 1 offsets, "
                             f"got {cu.dtype} of shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{_NAME}: '{name}' is on {cu.device} but 'q' is on {q.device}")
        if len(cu) != len(cu_seqlens_q):
            raise ValueError(f"{_NAME}: 'cu_seqlens_k' has {len(cu)} entries but 'cu_seqlens_q' "
                             f"{len(cu_seqlens_q)}; they must match (batch + 1)")
        param = "max_seqlen_" + total
        if not isinstance(longest, int) or isinstance(longest, bool) or longest < 0:
            raise TypeError(f"{_NAME}: '{param}' must be a non-negative int, got {longest!r}")
        if cu.device.type != "cpu":
            continue            # reading GPU offsets back would stall the stream: trusted
        offsets = cu.tolist()
        lengths = [b - a for a, b in zip(offsets, offsets[1:])]
        if offsets[0] != 0 or offsets[-1] != t.shape[0] or min(lengths, default=0) < 0:
            raise ValueError(f"{_NAME}: '{name}' must rise from 0 to {total}.shape[0] "
                             f"({t.shape[0]}), got {offsets}")
        if max(lengths, default=0) > longest:
            raise ValueError(f"{_NAME}: '{param}' is {longest} but a sequence of '{name}' has "
                             f"{max(lengths)} rows")
    if softmax_scale is None:
        return 1.0 / math.sqrt(q.shape[2])
    if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale):
        raise TypeError(f"{_NAME}: 'softmax_scale' must be a finite number or None, got {softmax_scale!r}")
    return float(softmax_scale)


# --- torch.library: the forward with its backward ---------------------------------------------------
@torch.library.custom_op("tilews::attention_varlen", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                                "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal) "
                                "-> (Tensor, Tensor)")
def _attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal):
    """(output, base-2 log-sum-exp): the forward that keeps what the backward reads."""
    return varlen_forward(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k,
                          max_seqlen_q, max_seqlen_k, softmax_scale, causal, store_lse=True)


@_attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale, causal):
    rows = lse_rows(max_seqlen_q, forward_blocks(q.shape[2], gpu=q.device.type == "cuda")["block_M"])
    return (torch.empty_like(q),
            q.new_empty((cu_seqlens_q.shape[0] - 1, q.shape[1], rows), dtype=torch.float32))


def _setup_backward(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, _, max_seqlen_k, softmax_scale, causal = inputs
    ctx.save_for_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, *output)
    ctx.max_seqlen_k, ctx.softmax_scale, ctx.causal = max_seqlen_k, softmax_scale, causal


def _backward(ctx, grad_out, grad_lse):
    q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tilews.attention_varlen_backward(
        grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, ctx.max_seqlen_k,
        ctx.softmax_scale, ctx.causal)
    return dq, dk, dv, None, None, None, None, None, None


_attention_varlen_op.register_autograd(_backward, setup_context=_setup_backward)


@torch.library.custom_op("tilews::attention_varlen_backward", mutates_args=(),
                         schema="(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                                "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_k, "
                                "float softmax_scale, bool causal) -> (Tensor, Tensor, Tensor)")
def _attention_varlen_backward_op(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_k, softmax_scale, causal):
    return varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_k,
                           softmax_scale, causal)


@_attention_varlen_backward_op.register_fake
def _attention_varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_k, softmax_scale, causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
