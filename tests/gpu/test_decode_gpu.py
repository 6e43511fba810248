"""``tilews.ops.decode_attention`` and ``tilews.ops.mla_decode`` on a GPU at realistic sizes
against float64 torch references (dense and paged caches, ragged lengths, splits chosen by the
heuristic and forced), and on sm_90 the split kernels take the warp-specialized Gluon backend."""
from __future__ import annotations

import pytest
import torch

import tilews
from tilews.ops import decode_attention, mla_decode
from tilews.ops.decode import blocks, decode_program, mla_decode_program

from ..test_decode_ops import decode_reference, mla_reference, paginate

DEV = "cuda"


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def inputs(batch, heads, kv_heads, S, dim, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(s, generator=g, device=DEV).to(dtype)
            for s in ((batch, 1, heads, dim), (batch, S, kv_heads, dim), (batch, S, kv_heads, dim))]


def main_backend(kernel) -> str:
    report = kernel.report
    return (report.kernels[0] if report.kernels else report).backend


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch, heads, kv_heads, S, dim", [
    (1, 32, 8, 8192, 128), (4, 32, 4, 4100, 128), (16, 16, 16, 2048, 64), (2, 8, 1, 3000, 256)])
def test_decode_attention(batch, heads, kv_heads, S, dim, dtype):
    q, k, v = inputs(batch, heads, kv_heads, S, dim, dtype)
    lengths = torch.randint(1, S + 1, (batch,), dtype=torch.int32, device=DEV)
    lengths[0] = S
    want = decode_reference(q.cpu(), k.cpu(), v.cpu(), lengths.cpu())
    for splits in (None, 1, 5):
        out = decode_attention(q, k, v, lengths, num_splits=splits)
        torch.testing.assert_close(out.double().cpu(), want, atol=2e-2, rtol=2e-2)
    if S % 256 == 0:
        k_pages, table = paginate(k.cpu(), 256, seed=1)
        v_pages, _ = paginate(v.cpu(), 256, seed=1)
        out = decode_attention(q, k_pages.to(DEV), v_pages.to(DEV), lengths, table.to(DEV))
        torch.testing.assert_close(out.double().cpu(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("batch, S", [(1, 8192), (16, 4096), (64, 1024)])
def test_mla_decode(batch, S):
    g = torch.Generator(device=DEV).manual_seed(3)
    q, q_pe = (torch.randn(batch, 128, d, generator=g, device=DEV).half() for d in (512, 64))
    kv, k_pe = (torch.randn(batch, S, 1, d, generator=g, device=DEV).half() for d in (512, 64))
    lengths = torch.randint(1, S + 1, (batch,), dtype=torch.int32, device=DEV)
    want = mla_reference(q.cpu(), q_pe.cpu(), kv.cpu(), k_pe.cpu(), lengths.cpu())
    for splits in (None, 1, 4):
        out = mla_decode(q, q_pe, kv, k_pe, lengths, num_splits=splits)
        torch.testing.assert_close(out.double().cpu(), want, atol=2e-2, rtol=2e-2)
    kv_pages, table = paginate(kv.cpu(), 64, seed=2)
    kpe_pages, _ = paginate(k_pe.cpu(), 64, seed=2)
    out = mla_decode(q, q_pe, kv_pages.to(DEV), kpe_pages.to(DEV), lengths, table.to(DEV))
    torch.testing.assert_close(out.double().cpu(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("splits, page", [(1, None), (8, None), (8, (256, 256))])
def test_decode_split_kernel_takes_the_gluon_ws_backend(splits, page):
    kernel = tilews.jit(out_idx=[-1], target="hopper")(decode_program)(
        2, 32, 4, 128, 8192, splits, page=page, **blocks(128, gpu=True))
    assert main_backend(kernel) == "gluon", kernel.report
    assert any("warp_specialize:" in n for n in kernel.report.notes), kernel.report.notes


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("splits, ragged", [(1, False), (8, True)])
def test_mla_split_kernel_takes_the_gluon_ws_backend(splits, ragged):
    kernel = tilews.jit(out_idx=[-1], target="hopper")(mla_decode_program)(
        128, 8192, 512, 64, batch=2, splits=splits, ragged=ragged)
    assert main_backend(kernel) == "gluon", kernel.report
    assert any("warp_specialize:" in n for n in kernel.report.notes), kernel.report.notes


@pytest.mark.parametrize("paged", [False, True])
def test_kept_decode_call_under_a_cuda_graph(paged):
    """A kept call (the split and the combine kernel, 16 splits) captured in a CUDA graph: each
    replay reads the query's new values; paged without lengths (made per call) as well."""
    q, k, v = inputs(1, 32, 8, 8192, 128, torch.bfloat16, seed=5)
    lengths = None if paged else torch.full((1,), 6000, dtype=torch.int32, device=DEV)
    table = None
    if paged:
        k_pages, table = paginate(k.cpu(), 256, seed=2)
        v_pages, _ = paginate(v.cpu(), 256, seed=2)
        k, v, table = k_pages.to(DEV), v_pages.to(DEV), table.to(DEV)
    decode_attention(q, k, v, lengths, table, num_splits=16)      # compiled and its call kept
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, lengths, table, num_splits=16)
    for seed in range(3):
        q.copy_(torch.randn(q.shape, generator=torch.Generator(device=DEV).manual_seed(seed), device=DEV))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = decode_attention(q, k, v, lengths, table, num_splits=16)
        torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize("batch, heads, kv_heads, S", [(1, 32, 8, 8192), (8, 32, 8, 8192), (2, 64, 8, 32768)])
def test_fused_combine_matches_the_two_kernel_form(monkeypatch, batch, heads, kv_heads, S):
    """The split kernel merging its own splits (the default) agrees with the two-kernel form
    (to an fp16 rounding: the merge is one code, compiled by two backends on Hopper) at the op's
    split count and at 16, and gives the same bits on every call whichever block arrives last;
    the stream's arrival counters are back at 0; twenty calls back to back on those counters,
    lengths changing each call (some 0), all right."""
    from tilews.ops import decode as dec
    from tilews.ops.arrivals import arrival_counters
    q, k, v = inputs(batch, heads, kv_heads, S, 128, torch.float16, seed=7)
    lengths = torch.randint(1, S + 1, (batch,), dtype=torch.int32, device=DEV)
    for splits in (None, 16):
        outs = {}
        for fused in (False, True):           # the fused form's call kept last
            monkeypatch.setattr(dec, "_calls", {})
            monkeypatch.setattr(dec, "fuses_combine", lambda target, fused=fused: fused)
            outs[fused] = decode_attention(q, k, v, lengths, num_splits=splits)
        again = [decode_attention(q, k, v, lengths, num_splits=splits) for _ in range(5)]
        torch.cuda.synchronize()
        torch.testing.assert_close(outs[True], outs[False], atol=1e-3, rtol=1e-3)
        assert all(torch.equal(out, outs[True]) for out in again), splits
        assert int(arrival_counters(q.device, 0).abs().sum()) == 0
    monkeypatch.setattr(dec, "fuses_combine", lambda target: True)
    runs = []
    for seed in range(20):
        lengths = torch.randint(0, S + 1, (batch,), dtype=torch.int32, device=DEV,
                                generator=torch.Generator(device=DEV).manual_seed(seed))
        runs.append((lengths, decode_attention(q, k, v, lengths, num_splits=16)))
    torch.cuda.synchronize()
    assert int(arrival_counters(q.device, 0).abs().sum()) == 0
    for lengths, out in runs[::7]:
        want = decode_reference(q.cpu(), k.cpu(), v.cpu(), lengths.cpu())
        torch.testing.assert_close(out.double().cpu(), want, atol=2e-2, rtol=2e-2)


def test_fused_mla_matches_the_two_kernel_form(monkeypatch):
    from tilews.ops import decode as dec
    g = torch.Generator(device=DEV).manual_seed(4)
    q, q_pe = (torch.randn(2, 128, d, generator=g, device=DEV).half() for d in (512, 64))
    kv, k_pe = (torch.randn(2, 8192, 1, d, generator=g, device=DEV).half() for d in (512, 64))
    lengths = torch.tensor([8192, 3000], dtype=torch.int32, device=DEV)
    outs = {}
    for fused in (True, False):
        monkeypatch.setattr(dec, "_calls", {})
        monkeypatch.setattr(dec, "fuses_combine", lambda target, fused=fused: fused)
        outs[fused] = mla_decode(q, q_pe, kv, k_pe, lengths, num_splits=8)
    torch.testing.assert_close(outs[True], outs[False], atol=1e-3, rtol=1e-3)
    want = mla_reference(q.cpu(), q_pe.cpu(), kv.cpu(), k_pe.cpu(), lengths.cpu())
    torch.testing.assert_close(outs[True].double().cpu(), want, atol=2e-2, rtol=2e-2)
