"""``tilews.ops.attention_varlen`` on an sm_90 GPU at realistic sizes: forward and backward
against a float64 per-sequence reference (relative Frobenius error), no NaN, and the forward and
backward main kernels compiled for target "hopper" (warp-specialized Gluon, never a silent
fallback to triton.language), the forward persistent (one block per SM)."""
from __future__ import annotations

import pytest
import torch

from tilews.ops import attention_varlen
from tilews.ops.attention import blocks, mha_fwd_varlen_program
from tilews.ops.attention_backward import blocks as backward_blocks
from tilews.ops.attention_backward import bwd_varlen_program
from tilews.ops.attention_varlen import _factory

from ..test_attention_varlen import reference

pytestmark = pytest.mark.gpu


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 4])
def test_varlen_forward_backward_on_hopper(D, causal, group):
    _hopper()
    g = torch.Generator().manual_seed(0)
    lq = torch.randint(1, 1500, (6,), generator=g).tolist() + [1, 128, 129]
    lk = [n if i % 2 else n + 77 for i, n in enumerate(lq)]      # some q shorter than k
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    H = 16
    q = torch.randn(sum(lq), H, D, generator=g).half()
    k, v = (torch.randn(sum(lk), H // group, D, generator=g).half() for _ in range(2))
    do = torch.randn(q.shape, generator=g).half()
    want = reference(q, k, v, cu_q.tolist(), cu_k.tolist(), causal, D ** -0.5, do)
    q, k, v, do, cuq, cuk = (t.cuda() for t in (q, k, v, do, cu_q, cu_k))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention_varlen(q, k, v, cuq, cuk, max(lq), max(lk), causal=causal)
    out.backward(do)
    for name, got, w in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), want):
        assert not got.isnan().any(), name
        assert rel(got.detach().cpu(), w) < 1e-2, (name, rel(got.detach().cpu(), w))
    fwd = _factory(mha_fwd_varlen_program, "auto")(H, H // group, D, causal, store_lse=True, **blocks(D, True))
    assert fwd.target == "hopper", (fwd.target, fwd.report.notes)
    assert any(n.startswith("persist:") and "one block per SM" in n for n in fwd.report.notes), \
        fwd.report.notes
    bwd = _factory(bwd_varlen_program, "auto")(H, H // group, D, causal, sm_scale=D ** -0.5,
                                               **backward_blocks(D, True, varlen=True))
    assert bwd.target == "hopper", (bwd.target, bwd.report.notes)
