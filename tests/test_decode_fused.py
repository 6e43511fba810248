"""The decode ops' split kernels combining their own splits (``settle_program`` in
``tilews/ops/decode.py``): each split block stores its partial and log-sum-exp, counts itself in
this stream's arrival counters (``tilews/ops/arrivals.py``), and the last of a row tile's splits
merges them. On ``interpret`` and ``triton`` (Triton's CPU interpreter) against float64 torch
references, outputs and workspaces poisoned (the tests' settings): ragged lengths with a
sequence shorter than one split and one of length 0, dense and paged caches, several split
counts and GQA groups; the counters are back at 0 after every call (a second call on them is
right); the fused form gives the two-kernel form's bits; blocks finishing in any order give the
same bits; the split kernel stays warp-specialized on Hopper with no spills (compile-only)."""
from __future__ import annotations

import re

import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_function
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.lowering.traverse import walk
from tilews.ops import decode as dec
from tilews.ops import decode_attention, mla_decode
from tilews.ops.arrivals import arrival_counters
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import gluon_program, poisoned
from .test_decode_ops import (TOL, decode_reference, gqa_inputs, mla_inputs, mla_reference,
                              paginate)

TARGETS = ["interpret", "triton"]
CPU = torch.device("cpu")
# 128 keys are 4 K/V blocks of 32 on the CPU: 0 keys; 20, fewer than any split's share (one block
# or more); 65, one past two blocks; the whole cache
LENGTHS = [0, 20, 65, 128]


def counters_are_zero() -> bool:
    return int(arrival_counters(CPU, 0).abs().sum()) == 0


@pytest.fixture
def fresh(monkeypatch):
    """No kept calls (each test plans its first call of a kind)."""
    monkeypatch.setattr(dec, "_calls", {})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("group, splits", [(1, 2), (4, 3), (8, 5)])
def test_ragged_dense_and_paged(fresh, target, group, splits):
    """Splits 3 and 5 of 4 blocks leave the last split empty for every sequence; the second call
    of a kind (new data, new lengths) runs on the counters the first left."""
    for call in range(2):
        q, k, v = gqa_inputs(4, 1, 2 * group, 2, 128, 64)
        q, v = q + call, v * (1 + call)
        lengths = torch.tensor(LENGTHS[call:] + LENGTHS[:call], dtype=torch.int32)
        want = decode_reference(q, k, v, lengths)
        out = decode_attention(q, k, v, lengths, num_splits=splits, target=target)
        assert counters_are_zero()
        torch.testing.assert_close(out.double(), want, **TOL)
        k_pages, table = paginate(k, 32, seed=call)
        v_pages, _ = paginate(v, 32, seed=call)
        out = decode_attention(q, k_pages, v_pages, lengths, table, num_splits=splits, target=target)
        assert counters_are_zero()
        torch.testing.assert_close(out.double(), want, **TOL)
    assert len(dec._calls) == 2


@pytest.mark.parametrize("target", TARGETS)
def test_fused_gives_the_two_kernel_forms_bits(fresh, monkeypatch, target):
    """Both forms merge in split order with the same arithmetic: GQA with two query tokens (32
    rows of a 16-row tile: two row tiles per KV head) and MLA, paged."""
    q, k, v = gqa_inputs(2, 2, 16, 2, 128, 64)
    lengths = torch.tensor([20, 101], dtype=torch.int32)
    q_nope, q_pe, kv, k_pe = mla_inputs(2, 64, 128, 64, 32)
    kv_pages, table = paginate(kv, 64, seed=4)
    kpe_pages, _ = paginate(k_pe, 64, seed=4)
    outs = {}
    for fused in (True, False):
        monkeypatch.setattr(dec, "fuses_combine", lambda target, fused=fused: fused)
        outs[fused] = (decode_attention(q, k, v, lengths, num_splits=3, target=target),
                       mla_decode(q_nope, q_pe, kv_pages, kpe_pages, lengths, table, num_splits=2,
                                  target=target))
        assert counters_are_zero()
    for fused, two_kernel in zip(outs[True], outs[False]):
        assert torch.equal(fused, two_kernel)
    torch.testing.assert_close(outs[True][0].double(), decode_reference(q, k, v, lengths), **TOL)
    torch.testing.assert_close(outs[True][1].double(),
                               mla_reference(q_nope, q_pe, kv, k_pe, lengths), **TOL)


def test_blocks_finishing_in_any_order_give_the_same_bits():
    """The split kernel on the interpreter with its blocks in shuffled orders (so a different
    split arrives last): the same output, counters back at 0 each time."""
    batch, heads, kv_heads, dim, keys, splits = 2, 8, 2, 64, 128, 4
    kernel = dec._jit(dec.decode_program, "interpret")(
        batch, heads, kv_heads, dim, keys, splits, T.float16, None, True, None,
        **dec.blocks(dim, gpu=False))
    [split_kernel] = kernel.kernels
    q, k, v = gqa_inputs(batch, 1, heads, kv_heads, keys, dim)
    lengths = torch.tensor([37, 128], dtype=torch.int32)
    arrivals = torch.zeros(batch * kv_heads, dtype=torch.int32)
    want = None
    for order in range(4):
        out = poisoned(batch, heads, dim, dtype=torch.float16)
        named = dict(Q=q.view(batch, heads, dim), K=k, V=v, cache_seqlens=lengths,
                     arrival_slots=arrivals.numel(), Arrivals=arrivals, Out=out,
                     O_part=poisoned(batch, splits, heads, dim, dtype=torch.float32),
                     LSE=poisoned(batch, splits, heads, dtype=torch.float32))
        interpreter.run(split_kernel.ir_before, [named[p.name] for p in split_kernel.ir_before.params],
                        block_order=order)
        assert int(arrivals.abs().sum()) == 0
        want = out if want is None else want
        assert torch.equal(out, want), order
    torch.testing.assert_close(want.double().view(batch, 1, heads, dim),
                               decode_reference(q, k, v, lengths), **TOL)


@pytest.mark.parametrize("splits, fused, kernels, atomics", [
    (1, True, 1, 0), (2, True, 1, 2), (2, False, 2, 0)])
def test_kernels_and_arrivals_of_each_form(splits, fused, kernels, atomics):
    """One split writes the output itself (no workspaces, no counting); more, fused: one kernel
    counting its arrivals (the arrival and the reset); the two-kernel form counts nothing."""
    kernel = dec._jit(dec.decode_program, "interpret")(1, 8, 2, 64, 64, splits, T.float16, None, True,
                                                       None, **dec.blocks(64, gpu=False), fused=fused)
    assert len(kernel.kernels) == kernels
    body = kernel.kernels[0].ir_before.body
    assert sum(isinstance(s, ir.AtomicAdd) for s in walk(body)) == atomics
    assert bool(kernel.kernels[0].ir_before.scratch) == (splits > 1)


@pytest.mark.parametrize("program", [
    lambda: dec.decode_program(1, 32, 8, 128, 8192, 16, **dec.blocks(128, gpu=True)),
    lambda: dec.decode_program(8, 32, 8, 128, 8192, 2, page=(4096, 256), **dec.blocks(128, gpu=True)),
    lambda: dec.mla_decode_program(128, 8192, 512, 64, batch=1, splits=32, ragged=True),
], ids=["gqa_b1_x16", "gqa_paged_b8_x2", "mla_b1_x32"])
def test_fused_split_kernel_stays_warp_specialized_without_spills(program):
    """At the sizes issue 40 times (GQA H32 KVH8 D128 8k keys; MLA 128 heads, 512 + 64, its 32
    splits at 8k keys: a merge loading all 32 partials at once spilled): an AsyncPlan, one
    acq_rel arrival, no bulk store, and ptxas's sm_90a report shows no spills."""
    from tilews.triton_ext.toolchain import ptxas_report
    kernel = lower(build_function(program()).kernels[0], HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None, kernel.notes
    ptx = gluon_program(kernel).asm["ptx"]
    assert ptx.count("atom.global.gpu.acq_rel.add") == 1
    # no bulk (TMA) store: one would not be visible to the merging block after the release
    assert "cp.async.bulk.tensor" in ptx                                   # the TMA loads
    assert not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report


def test_merge_issues_every_load_before_its_arithmetic():
    """GQA B1 x16 on sm_90a (compile-only SASS): after the arrival's atomic the last split block
    loads every split's log-sum-exp and partial before its first max, and no barrier steps through
    the splits. Its row vectors (weights, sums) used to default to a layout of their own, so each
    split converted its weights through shared memory (two barriers, 41 after the atomic) and
    waited for its own loads first: 16 loads before the first max of 95, one L2 round trip per split."""
    from tilews.triton_ext.toolchain import sass
    kernel = lower(build_function(dec.decode_program(1, 32, 8, 128, 8192, 16,
                                                     **dec.blocks(128, gpu=True))).kernels[0], HOPPER)
    text = sass(gluon_program(kernel).asm["ptx"])
    if text is None:
        pytest.skip("this Triton bundles no ptxas or cuobjdump")
    ops = [op for _, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?(\S+)", text)]
    merge = ops[next(i for i, op in enumerate(ops) if op.startswith("ATOMG")):]
    merge = merge[:merge.index("EXIT")] if "EXIT" in merge else merge
    first_max = next(i for i, op in enumerate(merge) if op.startswith("FMNMX"))
    loads = [op for op in merge if op.startswith("LDG")]
    assert len(loads) >= 2 * 16
    assert sum(op.startswith("LDG") for op in merge[:first_max]) == len(loads)
    assert sum(op.startswith("BAR.SYNC") for op in merge) <= 8
