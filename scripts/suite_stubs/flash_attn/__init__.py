"""A stand-in for FlashAttention's ``flash_attn`` package, NOT FlashAttention: plain float32 torch
attention, one sequence at a time. ``scripts/tilelang_suite.py run`` puts its folder on
``PYTHONPATH`` only where the real ``flash_attn`` does not import (it is not installable on the GPU
machine), because TileLang's varlen forward examples (``flash_attention/example_mha_fwd_varlen.py``,
``example_gqa_fwd_varlen.py``) check their kernels against ``flash_attn.flash_attn_varlen_func``,
the only name of it those examples call. The suite's report says when it was used; the "FA2
time" those examples print then times this module, not FlashAttention.

FlashAttention's conventions: ``q`` is ``[total_q, heads, D]`` and ``k``, ``v`` are
``[total_k, kv_heads, D]``, the sequences packed one after another; sequence ``b`` is rows
``cu_seqlens[b]:cu_seqlens[b + 1]``. Query head ``h`` reads key/value head
``h // (heads // kv_heads)`` (GQA). ``causal`` aligns the mask to the bottom-right corner (as
FlashAttention does since 2.1): query ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sees
keys ``j <= i + Lk - Lq``; a query that sees no key gets zeros. The result has ``q``'s dtype.
"""
from __future__ import annotations

import torch

STAND_IN = True         # what tilelang_suite.py's report reads to say this was not FlashAttention


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False):
    """Attention of each packed sequence, computed in float32; see the module docstring."""
    if dropout_p != 0.0:
        raise NotImplementedError("the flash_attn stand-in computes dropout_p=0.0 only")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"q has {heads} heads, not a multiple of k's {kv_heads}")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        (q0, q1), (k0, k1) = starts_q[b:b + 2], starts_k[b:b + 2]
        if q1 == q0 or k1 == k0:
            continue
        qb = q[q0:q1].float().transpose(0, 1)                                  # [h, Lq, D]
        kb = k[k0:k1].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        vb = v[k0:k1].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        scores = qb @ kb.transpose(1, 2) * scale                               # [h, Lq, Lk]
        if causal:
            i = torch.arange(q1 - q0, device=q.device)[:, None]
            j = torch.arange(k1 - k0, device=q.device)[None, :]
            hidden = j > i + (k1 - k0) - (q1 - q0)                             # [Lq, Lk]
            scores = scores.masked_fill(hidden, float("-inf"))
        weights = torch.softmax(scores, -1)
        if causal:                      # a query that sees no key: zeros, not softmax's NaN
            weights = weights.masked_fill(hidden.all(-1, keepdim=True), 0.0)
        out[q0:q1] = (weights @ vb).transpose(0, 1)
    return out.to(q.dtype)
