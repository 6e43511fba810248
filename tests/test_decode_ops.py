"""``tilews.ops.decode_attention`` and ``tilews.ops.mla_decode`` (``tilews/ops/decode.py``): split-KV
decoding over dense and paged KV caches with ragged lengths, on ``interpret`` and ``triton``
(Triton's CPU interpreter) against float64 torch references, outputs poisoned (the tests'
settings poison every output a kernel allocates); argument errors name the parameter; the split
heuristic at GPU-like numbers; the split kernels stay warp-specialized on Hopper (compile-only
lowering) at realistic sizes."""
from __future__ import annotations

import pytest
import torch

from tilews.lowering.frontend import build_function
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.ops import decode_attention, mla_decode
from tilews.ops.decode import (MAX_SPLITS, MIN_BLOCKS_PER_SPLIT, choose_num_splits, decode_program,
                               mla_decode_program)
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import randn

TARGETS = ["interpret", "triton"]
TOL = dict(atol=2e-2, rtol=2e-2)


def decode_reference(q, k, v, lengths, scale=None):
    """float64 softmax(q k^T) v per sequence over its first ``lengths[b]`` keys (dense caches)."""
    batch, sq, heads, dim = q.shape
    group = heads // k.shape[2]
    scale = dim ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(batch):
        kb = k[b, :lengths[b]].double().repeat_interleave(group, 1)
        vb = v[b, :lengths[b]].double().repeat_interleave(group, 1)
        w = torch.softmax(torch.einsum("qhd,shd->qhs", q[b].double(), kb) * scale, -1)
        out[b] = torch.einsum("qhs,shd->qhd", w, vb)
    return out


def paginate(cache, page_size, seed):
    """``cache`` [batch, S, ...] as shuffled pages [num_pages, page_size, ...] and its table."""
    batch, S = cache.shape[:2]
    per = S // page_size
    order = torch.randperm(batch * per, generator=torch.Generator().manual_seed(seed))
    pages = torch.empty(batch * per, page_size, *cache.shape[2:], dtype=cache.dtype)
    pages[order] = cache.reshape(batch * per, page_size, *cache.shape[2:])
    return pages, order.view(batch, per).to(torch.int32)


def gqa_inputs(batch, sq, heads, kv_heads, S, dim, dtype=torch.float16):
    return (randn(batch, sq, heads, dim, dtype=dtype, seed=1), randn(batch, S, kv_heads, dim, dtype=dtype, seed=2),
            randn(batch, S, kv_heads, dim, dtype=dtype, seed=3))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("group", [1, 4, 8])
def test_ragged_dense_gqa(target, group):
    """Lengths 1, one past a block, and a partial last block; splits 1 and 3 agree."""
    q, k, v = gqa_inputs(3, 1, 2 * group, 2, 96, 64)
    lengths = torch.tensor([1, 33, 90], dtype=torch.int32)
    want = decode_reference(q, k, v, lengths)
    outs = [decode_attention(q, k, v, lengths, num_splits=s, target=target) for s in (1, 3)]
    for out in outs:
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(out.double(), want, **TOL)
    torch.testing.assert_close(outs[0].double(), outs[1].double(), atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("target", TARGETS)
def test_paged_matches_dense(target):
    q, k, v = gqa_inputs(2, 1, 8, 2, 128, 64, dtype=torch.bfloat16)
    lengths = torch.tensor([75, 128], dtype=torch.int32)
    k_pages, table = paginate(k, 32, seed=5)
    v_pages, _ = paginate(v, 32, seed=5)
    want = decode_reference(q, k, v, lengths)
    for splits in (1, 2):
        out = decode_attention(q, k_pages, v_pages, lengths, table, num_splits=splits, target=target)
        torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)


def test_full_cache_several_query_tokens_and_scale():
    """``cache_seqlens=None``: the whole cache (a length not a multiple of the block); three query
    tokens per sequence; an explicit softmax scale; head dim 128."""
    q, k, v = gqa_inputs(2, 3, 8, 2, 70, 128)
    want = decode_reference(q, k, v, [70, 70], scale=0.05)
    for splits in (1, 2):
        out = decode_attention(q, k, v, num_splits=splits, softmax_scale=0.05, target="interpret")
        torch.testing.assert_close(out.double(), want, **TOL)


def test_zero_length_sequence_gives_zeros():
    q, k, v = gqa_inputs(2, 1, 4, 1, 64, 64)
    lengths = torch.tensor([0, 40], dtype=torch.int32)
    for splits in (1, 2):
        out = decode_attention(q, k, v, lengths, num_splits=splits, target="interpret")
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        torch.testing.assert_close(out[1:].double(), decode_reference(q[1:], k[1:], v[1:], [40]), **TOL)


def test_empty_batch():
    q, k, v = gqa_inputs(0, 1, 4, 1, 32, 64)
    assert decode_attention(q, k, v).shape == (0, 1, 4, 64)


def mla_reference(q, q_pe, kv, k_pe, lengths):
    scale = (q.shape[-1] + q_pe.shape[-1]) ** -0.5
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        n = lengths[b]
        s = (q[b].double() @ kv[b, :n, 0].double().T + q_pe[b].double() @ k_pe[b, :n, 0].double().T) * scale
        out[b] = torch.softmax(s, -1) @ kv[b, :n, 0].double()
    return out


def mla_inputs(batch, heads, S, dim, pe_dim):
    return (randn(batch, heads, dim, dtype=torch.float16, seed=11), randn(batch, heads, pe_dim, dtype=torch.float16, seed=12),
            randn(batch, S, 1, dim, dtype=torch.float16, seed=13), randn(batch, S, 1, pe_dim, dtype=torch.float16, seed=14))


@pytest.mark.parametrize("target", TARGETS)
def test_mla_dense_and_paged(target):
    q, q_pe, kv, k_pe = mla_inputs(2, 64, 128, 64, 32)
    lengths = torch.tensor([1, 100], dtype=torch.int32)
    want = mla_reference(q, q_pe, kv, k_pe, lengths)
    kv_pages, table = paginate(kv, 64, seed=7)
    kpe_pages, _ = paginate(k_pe, 64, seed=7)
    outs = [mla_decode(q, q_pe, kv, k_pe, lengths, num_splits=1, target=target),
            mla_decode(q, q_pe, kv_pages, kpe_pages, lengths, table, num_splits=2, target=target)]
    for out in outs:
        assert out.shape == q.shape
        torch.testing.assert_close(out.double(), want, **TOL)


def test_mla_full_cache():
    q, q_pe, kv, k_pe = mla_inputs(1, 64, 96, 64, 32)
    want = mla_reference(q, q_pe, kv, k_pe, [96])
    for splits in (1, 2):
        torch.testing.assert_close(mla_decode(q, q_pe, kv, k_pe, num_splits=splits, target="interpret").double(),
                                   want, **TOL)


def test_split_heuristic():
    # batch 1, 8 KV heads (8 tiles) on 132 SMs: 16 splits fill one wave (128 blocks); 8k keys
    # are 64 blocks of 128, at least MIN_BLOCKS_PER_SPLIT each: 16 at most
    assert choose_num_splits(8, 8192, 128, 132) == 64 // MIN_BLOCKS_PER_SPLIT
    assert choose_num_splits(8, 32768, 128, 132) == 16
    # batch 8 x 8 KV heads: 2 splits are one wave of 128 blocks; 3 would be two waves, one half empty
    assert choose_num_splits(64, 8192, 128, 132) == 2
    assert choose_num_splits(64 * 8, 8192, 128, 132) == 1          # the grid already fills the SMs
    assert choose_num_splits(1, 1 << 20, 64, 132) == min(132, MAX_SPLITS)
    # a short cache: each split keeps at least MIN_BLOCKS_PER_SPLIT blocks
    assert choose_num_splits(2, 1024, 128, 132) == 8 // MIN_BLOCKS_PER_SPLIT
    assert choose_num_splits(2, 256, 128, 132) == 1
    assert choose_num_splits(0, 4096, 128, 132) == 1


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v: decode_attention(q[0], k, v), "'q' must be 4-d"),
    (lambda q, k, v: decode_attention(q, k.float(), v), "'k_cache' must be float16 or bfloat16"),
    (lambda q, k, v: decode_attention(q, k, v[:, :16]), "'v_cache' has shape"),
    (lambda q, k, v: decode_attention(q, k[..., :32], v[..., :32]), "'k_cache' has head dim 32"),
    (lambda q, k, v: decode_attention(q[:, :, :3], k, v), "'q' has 3 heads"),
    (lambda q, k, v: decode_attention(q, k, v, torch.ones(2, dtype=torch.int64)), "'cache_seqlens'"),
    (lambda q, k, v: decode_attention(q, k, v, num_splits=0), "'num_splits'"),
    (lambda q, k, v: decode_attention(q, k, v, block_table=torch.zeros(2, 2)), "'block_table'"),
    (lambda q, k, v: decode_attention(q, k[:1], v[:1]), "needs 'block_table'"),
])
def test_argument_errors_name_the_parameter(call, message):
    q, k, v = gqa_inputs(2, 1, 4, 2, 32, 64)
    with pytest.raises((TypeError, ValueError), match=message):
        call(q, k, v)


def test_mla_argument_errors():
    q, q_pe, kv, k_pe = mla_inputs(1, 64, 64, 64, 32)
    with pytest.raises(ValueError, match="'k_pe_cache' has shape"):
        mla_decode(q, q_pe, kv, k_pe[..., :16])
    with pytest.raises(ValueError, match="'q_nope' has 32 heads"):
        mla_decode(q[:, :32], q_pe[:, :32], kv, k_pe)
    with pytest.raises(TypeError, match="'kv_cache' is torch.bfloat16"):
        mla_decode(q, q_pe, kv.bfloat16(), k_pe)


def warp_specialized(prim) -> bool:
    kernel = lower(build_function(prim).kernels[0], HOPPER)
    return kernel.find_plan(AsyncPlan) is not None


@pytest.mark.parametrize("splits, page", [(1, None), (4, None), (4, (4096, 256))])
def test_decode_split_kernel_stays_warp_specialized(splits, page):
    """D 128, GQA group 8 (32 heads over 4 KV heads), 8k keys, ragged; dense and paged."""
    assert warp_specialized(decode_program(8, 32, 4, 128, 8192, splits, page=page))


@pytest.mark.parametrize("splits, page, ragged", [(1, None, False), (8, None, True), (8, (2048, 64), True)])
def test_mla_split_kernel_stays_warp_specialized(splits, page, ragged):
    """128 heads, latent 512 + rope 64, 8k keys."""
    assert warp_specialized(mla_decode_program(128, 8192, 512, 64, batch=2, splits=splits, page=page,
                                               ragged=ragged))


def test_one_head_per_kv_head_compiles_for_sm90():
    """Group 1 (16 heads over 16 KV heads): the tile's one valid row is stored from registers as
    a leading block one row wide (an H200 compile failed on it: the fragment was mapped onto the
    destination's only non-unit dim). Compile-only, the sm_90a PTX stores the row masked."""
    from .helpers import gluon_program
    kernel = lower(build_function(decode_program(16, 16, 16, 64, 2048, 1)).kernels[0], HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None, kernel.notes
    assert "st.global" in gluon_program(kernel).asm["ptx"]


@pytest.mark.parametrize("paged", [False, True])
def test_lengths_and_pages_past_the_cache_are_refused_on_the_cpu(paged):
    """On the CPU each call's lengths and pages are checked (a kept call's too): a length past
    the cache or a page past the pages would read other memory (on a GPU they are trusted)."""
    q, k, v = gqa_inputs(2, 1, 4, 1, 64, 64)
    cache = (k, v) if not paged else (paginate(k, 32, seed=3)[0], paginate(v, 32, seed=3)[0])
    table = paginate(k, 32, seed=3)[1] if paged else None
    good = torch.tensor([10, 64], dtype=torch.int32)
    decode_attention(q, *cache, good, table, target="interpret")          # keeps the call
    for bad in ([10, 65], [-1, 3]):
        with pytest.raises(ValueError, match=r"'cache_seqlens' holds values from -?\d+ to \d+; each "
                                             r"must be from 0 to 64"):
            decode_attention(q, *cache, torch.tensor(bad, dtype=torch.int32), table, target="interpret")
    if paged:
        wrong = table.clone()
        wrong[1, 0] = 4                                                    # 4 pages: 0..3
        with pytest.raises(ValueError, match="'block_table' holds values from 0 to 4; each must be "
                                             "from 0 to 3"):
            decode_attention(q, *cache, good, wrong, target="interpret")
