"""MLA decode (TileLang's ``deepseek_mla`` example, ``main_no_split``, written in our words as
``test_shared_lifetimes.mla_decode``) on the warp-specialized Gluon path on Hopper.

* Its 512-wide latent tiles are wider than one bulk-copy box (256 elements a dim):
  ``legalize_wgmma`` makes each such TMA load two copies of [64, 256] boxes into the column
  slices of the shared tile, completing on the same barrier (whose expect counts both), and the
  output's TMA store two stores of its slices.
* At batch 132 the grid (2, 132) has more tiles than SMs, but its persistent form cannot fit
  shared memory (across tiles the output cannot take the query's bytes): ``persist`` keeps the
  grid and says why in a note.
* The two consumer warp groups split the 64 x 512 accumulator by columns (64 x 256 each, one
  m64n256k16 wgmma per k step): no spills.

Compile-only for ``GPUTarget("cuda", 90, 32)`` at TileLang's sizes; the interpreter runs the
fully lowered Hopper program at reduced sizes against a float64 reference and against the
program before the passes (the same bits under random schedules)."""
from __future__ import annotations

import functools
import re

import pytest
import torch

import tilews
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes.legalize_wgmma import TMA_BOX
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import unwaited_global_accesses
from .test_shared_lifetimes import arrivals, mla_decode, mla_inputs, mla_reference
from .test_ws_oracle import run_interp

HEADS, KV_LEN, DIM, PE_DIM = 128, 8192, 512, 64     # TileLang's example sizes
SMEM = HOPPER.caps.smem_bytes


OUT = 6        # the lowered program's Out: after Q, Q_pe, KV, K_pe, arrival_slots, Arrivals


def tma_copies(kernel: ir.Kernel, name: str) -> list[ir.Copy]:
    return [s for s in walk(kernel.body) if isinstance(s, ir.Copy)
            and s.mechanism is ir.CopyMechanism.TMA and name in (s.src.buffer.name, s.dst.buffer.name)]


def columns(r: ir.Region) -> tuple[int, int]:
    return ir.as_int(r.starts[-1]), r.extents[-1]


@functools.lru_cache(maxsize=None)
def lowered(batch: int, dim: int = DIM, kv_len: int = KV_LEN, heads: int = HEADS,
            pe_dim: int = PE_DIM, block_N: int = 64, sms: int = 132) -> ir.Kernel:
    return lower(build_kernel(mla_decode(heads, kv_len, dim, pe_dim, block_N=block_N, batch=batch)),
                 HOPPER.replace(num_sms=sms))


def test_wide_tiles_are_copied_in_boxes_of_256():
    kernel = lowered(1)
    plan = kernel.plan(AsyncPlan)
    assert all(e <= TMA_BOX for _, box in plan.tma_descriptors for e in box), plan.tma_descriptors
    assert ("Q", (1, 64, 256)) in plan.tma_descriptors and ("KV", (1, 64, 1, 256)) in plan.tma_descriptors
    for glob, tile in (("Q", "q_tile"), ("KV", "kv_tile")):
        loads = tma_copies(kernel, glob)
        assert [columns(c.src) for c in loads] == [(0, 256), (256, 256)]
        assert [columns(c.dst) for c in loads] == [(0, 256), (256, 256)]
        assert {c.dst.buffer.name for c in loads} == {tile}
        assert len({c.barrier for c in loads}) == 1          # one expect counts both boxes
    stores = tma_copies(kernel, "Out")
    assert [(columns(c.src), columns(c.dst)) for c in stores] == [((0, 256), (0, 256)), ((256, 256), (256, 256))]
    consumer = next(r for r in walk(kernel.body) if isinstance(r, ir.Role) and stores[0] in walk(r.body))
    body = list(consumer.body.stmts)
    at = body.index(stores[1])
    assert body[at - 1] is stores[0] and isinstance(body[at + 1], ir.BulkStoreWait)


def test_the_expect_counts_every_box():
    from .helpers import gluon_program
    src = gluon_program(lowered(1)).source
    q_bytes, qpe_bytes = 64 * DIM * 2, 64 * PE_DIM * 2
    kv_bytes, kpe_bytes = 64 * DIM * 2, 64 * PE_DIM * 2
    assert f"mbarrier.expect(preloaded.index(0), {q_bytes + qpe_bytes})" in src
    assert f"mbarrier.expect(full.index(n % 2), {kv_bytes + kpe_bytes})" in src
    assert "q_tile.slice(256, 256, 1))" in src and "kv_tile.index(n % 2).slice(256, 256, 1))" in src


def test_persist_declines_what_cannot_fit_shared_memory():
    kernel = lowered(132)
    assert len(kernel.grid) == 2 and [ir.as_int(g) for g in kernel.grid] == [2, 132]
    assert not any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in walk(kernel.body))
    note = next(n for n in kernel.notes if n.startswith("persist:"))
    need = int(re.search(r"would need (\d+) bytes", note).group(1))
    assert need > SMEM and f"more than the {SMEM}" in note and "one block per tile" in note


def test_persist_still_applies_where_its_form_fits():
    """The same program at head dim 128: the persistent form (two query slots, no reuse) fits."""
    kernel = lowered(3, dim=128, kv_len=128, heads=64, pe_dim=32, block_N=32, sms=2)
    assert any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in walk(kernel.body))
    assert any(n.startswith("persist: 3 tiles > 2 SMs: one block per SM") for n in kernel.notes)


@pytest.mark.parametrize("batch", [1, 132])
def test_mla_decode_compiles_on_gluon_at_tilelang_sizes(batch):
    kernel = tilews.compile(mla_decode(HEADS, KV_LEN, DIM, PE_DIM, batch=batch), target="hopper")
    report = kernel.report
    assert report.backend == "gluon", report
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    assert ttgir.count("ttg.warp_specialize(") == 1
    boxes = [tuple(int(e) for e in m.split("x")[:-1])
             for m in re.findall(r"!tt\.tensordesc<tensor<([0-9x]+f16)", ttgir)]
    assert boxes and max(e for box in boxes for e in box) <= TMA_BOX, boxes
    assert len(re.findall(r"ttng\.async_tma_copy_global_to_local ", ttgir)) == 6           # Q and KV in two boxes each, Q_pe and K_pe in one
    assert len(re.findall(r"ttng\.async_tma_copy_local_to_global ", ttgir)) == 2
    assert kernel.program.metadata["shared"] <= SMEM
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert unwaited_global_accesses(ptx) == []     # every role waits for the previous grid first
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)) == \
        {"m64n256k16", "m64n32k16"}     # P V: 256 of the 512 columns per warp group; Q K^T: 32 of 64
    if batch > 1:
        assert any(n.startswith("persist:") and "one block per tile" in n for n in report.notes)


def assert_lowered_means_the_program(prim, config, args, seeds=(0, 1, 2)):
    before = build_kernel(prim)
    want = run_interp(before, args, OUT)
    torch.testing.assert_close(want.double(), mla_reference(*args[:4]), rtol=2e-2, atol=2e-2)
    after = lower(before, config)
    assert after.find_plan(AsyncPlan) is not None, after.notes
    for seed in seeds:
        assert torch.equal(run_interp(after, args, OUT, seed), want), seed
    return after


def test_reduced_mla_decode_means_the_program_on_hopper():
    heads, kv_len, dim, pe_dim = 64, 256, 128, 32
    args = mla_inputs(heads, kv_len, dim, pe_dim) + arrivals(lowered=True) + [torch.empty(1, heads, dim, dtype=torch.float16)]
    assert_lowered_means_the_program(mla_decode(heads, kv_len, dim, pe_dim, block_N=32), HOPPER, args)


@pytest.mark.parametrize("block_N, persistent", [(64, False), (32, True)])
def test_split_boxes_and_persistence_mean_the_program(block_N, persistent):
    """Head dim 512 (boxes split), 3 batches on 2 SMs, a short KV: with 64-row KV tiles the
    persistent form needs more shared memory than Hopper has (persist declines), with 32-row
    ones it fits (the tile loop over split boxes)."""
    heads, kv_len, dim, pe_dim, batch = 64, 128, 512, 32, 3
    args = mla_inputs(heads, kv_len, dim, pe_dim, batch=batch) + arrivals(lowered=True) + [
        torch.empty(batch, heads, dim, dtype=torch.float16)]
    prim = mla_decode(heads, kv_len, dim, pe_dim, block_N=block_N, batch=batch)
    after = assert_lowered_means_the_program(prim, HOPPER.replace(num_sms=2), args)
    note = next(n for n in after.notes if n.startswith("persist:"))
    assert ("one block per tile" not in note) == persistent, note
    assert [columns(c.dst) for c in tma_copies(after, "KV")] == [(0, 256), (256, 256)]


def test_a_two_stage_ring_releases_each_stage_in_its_own_iteration():
    """MLA decode's KV ring has 2 stages: ``overlap_mma`` leaves its P V gemm waited in the
    iteration that issued it (kept in flight, the release would come one iteration late and the
    producer's next fill would start only as its data is wanted)."""
    kernel = lowered(132)
    assert [s.outstanding for s in walk(kernel.body) if isinstance(s, ir.GemmWait)] == [0, 0]
    ring = next(s.buffer for s in walk(kernel.body) if isinstance(s, ir.Alloc) and s.buffer.name == "empty")
    assert len(ring.arrive_counts) == 2
