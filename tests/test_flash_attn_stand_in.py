"""scripts/suite_stubs/flash_attn: the float32 torch stand-in for FlashAttention's
``flash_attn_varlen_func`` that TileLang's varlen examples check against in the example suite,
compared with a float64 reference computed on padded tensors (another formulation than the
stand-in's per-sequence loop): MHA, GQA, causal aligned bottom-right with fewer and with more
queries than keys, an explicit ``softmax_scale``, an empty sequence; and its refusals."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from .helpers import randn

PATH = Path(__file__).resolve().parent.parent / "scripts/suite_stubs/flash_attn/__init__.py"
_spec = importlib.util.spec_from_file_location("flash_attn_stand_in", PATH)
stand_in = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stand_in)


def packed(lengths: list[int], heads: int, dim: int, seed: int):
    """fp16 rows of sequences of ``lengths`` packed one after another, and their cu_seqlens."""
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return randn(sum(lengths), heads, dim, dtype=torch.float16, seed=seed), cu


def reference(q, k, v, lens_q, lens_k, scale, causal):
    """float64 attention on padded ``[batch, max_len, heads, D]`` tensors with a visibility mask;
    a query that sees no key gives zeros; the result packed back."""
    batch, lq, lk = len(lens_q), max(lens_q), max(lens_k)
    rep = q.shape[1] // k.shape[1]

    def pad(x, lens, n):
        out = torch.zeros(batch, n, *x.shape[1:], dtype=torch.float64)
        starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
        for b in range(batch):
            out[b, :lens[b]] = x[starts[b]:starts[b + 1]].double()
        return out

    qp = pad(q, lens_q, lq)
    kp = pad(k, lens_k, lk).repeat_interleave(rep, 2)
    vp = pad(v, lens_k, lk).repeat_interleave(rep, 2)
    i = torch.arange(lq)[None, :, None]
    j = torch.arange(lk)[None, None, :]
    nq, nk = torch.tensor(lens_q)[:, None, None], torch.tensor(lens_k)[:, None, None]
    visible = (i < nq) & (j < nk)                                         # [b, lq, lk]
    if causal:
        visible &= j <= i + nk - nq
    scores = torch.einsum("bqhd,bkhd->bhqk", qp, kp) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)                   # rows without a key
    out = torch.einsum("bhqk,bkhd->bqhd", weights, vp)
    return torch.cat([out[b, :lens_q[b]] for b in range(batch)])


@pytest.mark.parametrize("heads, kv_heads, lens_q, lens_k, causal, scale", [
    (4, 4, [17, 5, 33], [17, 5, 33], False, None),                 # MHA, equal lengths
    (4, 4, [17, 5, 33], [17, 5, 33], True, None),
    (6, 2, [3, 16, 9], [20, 16, 30], True, None),                  # GQA, causal, q shorter than k
    (6, 3, [12, 7], [4, 7], True, None),                   # q longer than k: rows see nothing
    (4, 1, [8, 0, 11], [13, 6, 11], False, 0.3),                   # MQA, an empty query sequence
    (2, 2, [5, 6], [0, 9], False, None),                           # a sequence without keys
])
def test_stand_in_matches_a_float64_reference(heads, kv_heads, lens_q, lens_k, causal, scale):
    dim = 16
    q, cu_q = packed(lens_q, heads, dim, seed=1)
    k, cu_k = packed(lens_k, kv_heads, dim, seed=2)
    v, _ = packed(lens_k, kv_heads, dim, seed=3)
    out = stand_in.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), 0.0,
                                          softmax_scale=scale, causal=causal)
    want = reference(q, k, v, lens_q, lens_k, dim ** -0.5 if scale is None else scale, causal)
    assert out.dtype == torch.float16 and out.shape == q.shape
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-3)   # the result's fp16
    if causal and max(lens_q) > max(lens_k):
        assert (out[:lens_q[0] - lens_k[0]] == 0).all()                 # they see no key


def test_stand_in_refuses_what_it_does_not_compute():
    q, cu = packed([4], 4, 8, seed=1)
    k, _ = packed([4], 3, 8, seed=2)
    with pytest.raises(NotImplementedError, match="dropout_p=0.0 only"):
        stand_in.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, 0.1)
    with pytest.raises(ValueError, match="q has 4 heads, not a multiple of k's 3"):
        stand_in.flash_attn_varlen_func(q, k, k, cu, cu, 4, 4)
    assert stand_in.STAND_IN
