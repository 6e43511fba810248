"""Issue 38's programs on a Hopper GPU (target ``hopper``), against float64 torch, outputs poisoned:
tiles that are not powers of two on the Gluon path (attention at D 96 and 192, a forward that
stores the log-sum-exp), a varlen GQA decode (runtime trip counts, a shared column per k-block,
the first rows of a fragment stored), MLA decode (shared bytes reused by lifetime, TMA boxes of
256 columns) at two batches, and a split-then-combine pair of kernels sharing workspaces, run on
two CUDA streams at once. The CPU tests of the same programs compile them (tests/test_*.py); this
file runs them."""
from __future__ import annotations

import pytest
import torch

import tilews
from tilews.testing import rel_err

from ..helpers import poisoned
from ..passes.test_split_extents import attention
from ..test_decode_gluon import BLOCK_N, DIM, HEADS, KV_HEADS, MAX_LEN, check, inputs, varlen_decode
from ..test_gluon_odd_extents import forward_with_lse
from ..test_multi_kernel import lse_ref, split_sum_softmax
from ..test_shared_lifetimes import arrivals, mla_decode, mla_inputs, mla_reference

pytestmark = pytest.mark.gpu


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")


def _cuda(*xs):
    return [x.cuda() for x in xs]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [96, 192])
def test_attention_odd_head_dims(dim, causal):
    _hopper()
    B, H, S = 2, 4, 1000                       # a ragged last block
    k = tilews.jit(out_idx=[-1], target="hopper")(attention)(B, H, S, dim, causal)
    assert k.report.backend == "gluon", k.report.notes
    q, kk, v = (torch.randn(B, H, S, dim, device="cuda", dtype=torch.float16) for _ in range(3))
    out = k(q, kk, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kk.double(), v.double(),
                                                            is_causal=causal)
    assert rel_err(out, want) < 1e-2


@pytest.mark.parametrize("dim", [128, 192])
def test_forward_storing_lse(dim):
    _hopper()
    B, H, S = 2, 4, 512
    k = tilews.jit(target="hopper")(forward_with_lse)(B, H, S, dim)
    assert k.report.backend == "gluon", k.report.notes
    q, kk, v = (torch.randn(B, S, H, dim, device="cuda", dtype=torch.float16) for _ in range(3))
    out = poisoned(B, S, H, dim, dtype=torch.float16).cuda()
    lse = poisoned(B, H, S).cuda()
    k(q, kk, v, out, lse)
    logits = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk.double()) / dim ** 0.5
    assert rel_err(out, torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, -1), v.double())) < 1e-2
    assert rel_err(lse, torch.logsumexp(logits, -1) * 1.44269504) < 1e-4


def test_varlen_gqa_decode():
    _hopper()
    lengths = [70, 256, 129, 1]
    args = inputs(lengths, HEADS, KV_HEADS, DIM)
    k = tilews.jit(out_idx=[-2, -1], target="hopper")(varlen_decode)(
        len(lengths), HEADS, KV_HEADS, MAX_LEN, sum(lengths), DIM, BLOCK_N)
    assert k.report.backend == "gluon", k.report.notes
    o, m = k(*_cuda(*args))
    check(o.cpu(), m.cpu(), args)


@pytest.mark.parametrize("batch", [1, 3])
def test_mla_decode(batch):
    _hopper()
    args = mla_inputs(64, 1024, 512, 64, batch=batch)
    k = tilews.jit(target="hopper")(mla_decode)(64, 1024, 512, 64, batch=batch)
    assert k.report.backend == "gluon", k.report.notes
    out = poisoned(batch, 64, 512, dtype=torch.float16).cuda()
    k(*_cuda(*args, *arrivals()), out)
    assert rel_err(out, mla_reference(*[a.cuda() for a in args])) < 1e-2


def test_split_then_combine_on_two_streams():
    """Two calls at once on two streams each get their own workspaces (a shared one would mix
    the partial sums); each result matches its own input."""
    k = tilews.jit(out_idx=[-1], target="hopper")(split_sum_softmax)(256, 4, 4096, 16, 4)
    xs = [torch.randn(256, 4096, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [None, None]
    for _ in range(3):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i] = k(xs[i])
        torch.cuda.synchronize()
        for x, out in zip(xs, outs):
            assert rel_err(out, lse_ref(x.cpu()).cuda()) < 1e-5
