"""``tilews.ops.attention_varlen`` (FlashAttention's varlen convention) on the CPU.

* Forward and backward programs on ``interpret`` and ``triton`` (Triton's CPU interpreter), outputs
  poisoned, against a float64 per-sequence reference: ragged lengths (1, lengths that are not a
  multiple of the block, an empty sequence), causal with q shorter than k and q longer than k
  (bottom-right alignment; queries that see no key get zero), GQA 2 and 4, a softmax scale.
* The op: ``loss.backward()`` through ``tilews::attention_varlen``, argument errors naming the
  parameter, an empty batch.
* Hopper, compile-only: the varlen forward and backward main kernel stay warp-specialized
  (``AsyncPlan``) at D 64 / 128, and the dense programs' lowering is what it was.
"""
from __future__ import annotations

import math

import pytest
import torch

from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.ops import attention_varlen
from tilews.ops.attention import mha_fwd_varlen_program
from tilews.ops.attention_backward import bwd_varlen_program
from tilews.ops.attention_varlen import varlen_backward, varlen_forward
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import randn

D = 32


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()],
                        dtype=torch.int32)


def inputs(lq, lk, heads, kv_heads, dtype=torch.float16, seed=0):
    q = randn(sum(lq), heads, D, dtype=dtype, seed=seed + 1)
    k = randn(sum(lk), kv_heads, D, dtype=dtype, seed=seed + 2)
    v = randn(sum(lk), kv_heads, D, dtype=dtype, seed=seed + 3)
    return q, k, v, offsets(lq), offsets(lk)


def reference(q, k, v, cu_q, cu_k, causal, scale, grad_out=None):
    """(out, dq, dk, dv) in float64, one sequence at a time (a query seeing no key: zero)."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    outs = []
    for b in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]]
        g = q.shape[1] // k.shape[1]
        ks, vs = ks.repeat_interleave(g, 1), vs.repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        lq, lk = qs.shape[0], ks.shape[0]
        seen = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            seen = torch.arange(lk)[None] <= torch.arange(lq)[:, None] + lk - lq
        p = torch.softmax(s.masked_fill(~seen, -math.inf), -1).nan_to_num(0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vs))
    out = torch.cat(outs)
    if grad_out is None:
        return out.detach(), None, None, None
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def close(got, want, what, tol=2e-2):
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    scale = max(want.abs().max().item() if want.numel() else 0.0, 1.0)
    assert not got.isnan().any(), f"{what}: NaN"
    assert err <= tol * scale, f"{what}: max abs err {err:.3e} (scale {scale:.2f})"


# (lq, lk, heads, kv_heads): CPU blocks are 64 x 64 forward, 64 keys x 32 queries backward
CASES = {
    "ragged-gqa2": ([1, 70, 33, 130], [1, 70, 33, 130], 4, 2),
    "q-shorter-gqa4": ([5, 40, 1], [70, 100, 9], 4, 1),
    "q-longer-and-empty": ([90, 3, 0, 20], [30, 0, 7, 20], 2, 2),
}


@pytest.mark.parametrize("target", ["interpret", "triton"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward_match_float64(case, causal, target):
    lq, lk, heads, kv_heads = CASES[case]
    q, k, v, cu_q, cu_k = inputs(lq, lk, heads, kv_heads)
    grad_out = randn(*q.shape, dtype=q.dtype, seed=9)
    scale = 0.3 if case == "q-shorter-gqa4" else 1 / math.sqrt(D)
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, max(lq), max(lk), scale, causal,
                              store_lse=True, target=target)
    dq, dk, dv = varlen_backward(grad_out, q, k, v, out, lse, cu_q, cu_k, max(lk), scale, causal,
                                 target=target)
    want = reference(q, k, v, cu_q.tolist(), cu_k.tolist(), causal, scale, grad_out)
    for name, got, w in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), want):
        close(got, w, f"{case} {name}")


def test_lse_per_sequence_padded():
    """LSE [batch, heads, whole blocks of max_seqlen_q], base 2; +inf for a query seeing no key."""
    lq, lk = [3, 70], [1, 5]
    q, k, v, cu_q, cu_k = inputs(lq, lk, 2, 1)
    _, lse = varlen_forward(q, k, v, cu_q, cu_k, 70, 5, 1 / math.sqrt(D), True, store_lse=True,
                            target="interpret")
    assert lse.shape == (2, 2, 128)
    for b in range(2):
        qs = q[cu_q[b]:cu_q[b + 1]].double()
        ks = k[cu_k[b]:cu_k[b + 1]].double()
        s = torch.einsum("qhd,kd->hqk", qs, ks[:, 0]) / math.sqrt(D)
        seen = torch.arange(lk[b])[None] <= torch.arange(lq[b])[:, None] + lk[b] - lq[b]
        want = torch.logsumexp(s.masked_fill(~seen, -math.inf), -1) * math.log2(math.e)
        got = lse[b, :, :lq[b]].double()
        blind = ~seen.any(-1)                    # queries seeing no key
        assert torch.isinf(got[:, blind]).all() and (got[:, blind] > 0).all()
        assert torch.allclose(got[:, ~blind], want[:, ~blind], atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_through_the_op(causal):
    lq, lk = [17, 1, 64], [17, 1, 64]
    q, k, v, cu_q, cu_k = inputs(lq, lk, 4, 2, dtype=torch.bfloat16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention_varlen(q, k, v, cu_q, cu_k, 64, 64, causal=causal)
    grad_out = randn(*out.shape, dtype=out.dtype, seed=7)
    (out.float() * grad_out.float()).sum().backward()
    want = reference(q.detach(), k.detach(), v.detach(), cu_q.tolist(), cu_k.tolist(), causal,
                     1 / math.sqrt(D), grad_out)
    for name, got, w in zip(("out", "dq", "dk", "dv"), (out.detach(), q.grad, k.grad, v.grad), want):
        close(got, w, name, tol=3e-2)
    with torch.no_grad():                       # the plain path (no LSE) gives the same output
        assert torch.equal(attention_varlen(q, k, v, cu_q, cu_k, 64, 64, causal=causal), out.detach())


def test_empty_batch():
    q = torch.empty(0, 4, D, dtype=torch.float16, requires_grad=True)
    k = torch.empty(0, 2, D, dtype=torch.float16, requires_grad=True)
    v = torch.empty(0, 2, D, dtype=torch.float16, requires_grad=True)
    cu = torch.zeros(1, dtype=torch.int32)
    out = attention_varlen(q, k, v, cu, cu, 0, 0, causal=True)
    assert out.shape == (0, 4, D)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_argument_errors_name_the_parameter():
    q, k, v, cu_q, cu_k = inputs([3, 4], [3, 4], 4, 2)

    def call(**over):
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4, max_seqlen_k=4)
        args.update(over)
        return attention_varlen(**args)

    with pytest.raises(ValueError, match="'q' must be 3-d"):
        call(q=q[None])
    with pytest.raises(TypeError, match="'k' must be float16 or bfloat16"):
        call(k=k.float())
    with pytest.raises(TypeError, match="'v' is torch.bfloat16 but 'q'"):
        call(v=v.bfloat16())
    with pytest.raises(ValueError, match="kv_heads dividing"):
        call(k=randn(7, 3, D, dtype=torch.float16), v=randn(7, 3, D, dtype=torch.float16))
    with pytest.raises(ValueError, match="'cu_seqlens_q' must be a 1-d int32"):
        call(cu_seqlens_q=cu_q.long())
    with pytest.raises(ValueError, match="'cu_seqlens_k' has 2 entries"):
        call(cu_seqlens_k=offsets([7]))
    with pytest.raises(ValueError, match=r"'cu_seqlens_q' must rise from 0 to q.shape\[0\]"):
        call(cu_seqlens_q=offsets([3, 3]))
    with pytest.raises(ValueError, match="'max_seqlen_k' is 3 but a sequence"):
        call(max_seqlen_k=3)
    with pytest.raises(TypeError, match="'max_seqlen_q' must be a non-negative int"):
        call(max_seqlen_q=4.0)
    with pytest.raises(TypeError, match="'softmax_scale' must be a finite number"):
        call(softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="'cu_seqlens_k' must be a torch.Tensor"):
        call(cu_seqlens_k=[0, 3, 7])


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_keeps_the_varlen_kernels_warp_specialized(dim, causal):
    fwd = lower(build_kernel(mha_fwd_varlen_program(16, 4, dim, causal, store_lse=True)), HOPPER)
    assert fwd.find_plan(AsyncPlan) is not None, fwd.notes
    assert any(n.startswith("overlap_softmax") for n in fwd.notes), fwd.notes
    bwd = lower(build_kernel(bwd_varlen_program(16, 4, dim, causal)), HOPPER)
    assert bwd.find_plan(AsyncPlan) is not None, bwd.notes
