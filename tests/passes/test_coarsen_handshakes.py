"""coarsen_handshakes: ``examples/ws_gemm.py``'s explicit GEMM as its user wrote it (128x128x32
tiles, one handshake) hands its tiles over two k tiles at a time, so each hand-over carries a
128x128x64 step: the wgmma count per consumer iteration doubles, the barrier round trips and TMA
boxes per FLOP halve. Compile-only checks read the lowered IR, TTGIR and PTX for sm_90a at 8192^3;
the interpreter runs the lowered program under several schedules against the program as written
and a float32 product. Loops it cannot coarsen are left as written."""
from __future__ import annotations

import functools
import re

import pytest
import torch

import tilews.language as T
from examples.ws_gemm import ws_matmul_program
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import SharedMemoryPlan
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from ..helpers import gluon_program, randn
from ..test_ws_oracle import AS_WRITTEN_K, run_interp
from .test_ring_handshakes import consumer_loop, slots

H200 = HOPPER.replace(num_sms=132)


def coarsen_notes(kernel: ir.Kernel) -> list[str]:
    return [n for n in kernel.notes if n.startswith("coarsen_handshakes:")]


@functools.cache
def seed_gemm(coarsen: bool = True) -> ir.Kernel:
    config = H200 if coarsen else AS_WRITTEN_K.replace(num_sms=132)
    return lower(build_kernel(ws_matmul_program(8192, 8192, 8192, dtype=T.bfloat16)), config)


def wgmmas_per_iteration(ptx: str) -> int:
    """The wgmma instructions in ``ptx``: those of one iteration of the consumer's main loop
    (the loop is not unrolled, and nothing else in the kernel issues a wgmma)."""
    return len(re.findall(r"wgmma\.mma_async", ptx))


def test_seed_gemm_hands_over_128_byte_k_rows():
    kernel = seed_gemm()
    [note] = coarsen_notes(kernel)
    assert "hands A_s, B_s over 2 k tiles at a time" in note and "128 iterations instead of 256" in note
    assert slots(kernel) == {"A_s": 4, "B_s": 4, "ready": 4, "done": 4}
    shapes = {s.buffer.name: s.buffer.static_shape for s in kernel.body.stmts
              if isinstance(s, ir.Alloc) and s.buffer.name in ("A_s", "B_s")}
    assert shapes == {"A_s": (4, 128, 64), "B_s": (4, 64, 128)}
    assert kernel.find_plan(SharedMemoryPlan).total_bytes <= H200.caps.smem_bytes
    # still one wgmma group in flight, the previous slot released after the wait
    assert [s.outstanding for s in walk(consumer_loop(kernel)) if isinstance(s, ir.GemmWait)] == [1]
    asm = gluon_program(kernel).asm
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    assert re.search(r"scf\.for %ko = %c0_i32 to %c128_i32", ttgir)
    assert "memdesc<4x128x64xbf16" in ttgir and "memdesc<4x64x128xbf16" in ttgir
    assert re.findall(r"ttng\.barrier_expect %\w+, (\d+)", ttgir) == ["32768"]
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)
    assert len(re.findall(r"\b(ld|st)\.local\b", ptx)) == 0, "the kernel spills registers"
    # each hand-over carries four 64x128x16 wgmmas per warp group, twice those of the k tiles
    # as written
    assert wgmmas_per_iteration(ptx) == 4
    assert wgmmas_per_iteration(gluon_program(seed_gemm(coarsen=False)).asm["ptx"]) == 2


@pytest.mark.parametrize("K", [256, 240])      # 240: the last wide box reaches past K (zeros)
def test_coarsened_gemm_computes_the_product(K):
    """Eight k tiles of 32 become four of 64 (the ring of four still wraps once at 256: both
    parities). Every schedule gives the same result, equal to the program as written up to the
    order of float32 additions, and to the float32 product within fp16 rounding."""
    M, N = 128, 64
    a, b = randn(M, K, dtype=torch.float16, seed=11), randn(K, N, dtype=torch.float16, seed=12)
    args = [a, b, torch.empty(M, N, dtype=torch.float16)]
    before = build_kernel(ws_matmul_program(M, N, K, block_M=64, block_N=64, block_K=32))
    after = lower(before, HOPPER)
    assert coarsen_notes(after) and slots(after)["A_s"] == 4
    assert [s.buffer.static_shape for s in after.body.stmts
            if isinstance(s, ir.Alloc) and s.buffer.name == "A_s"] == [(4, 64, 64)]
    got = [run_interp(after, args, 2, seed=seed) for seed in range(4)]
    assert all(torch.equal(g, got[0]) for g in got[1:])
    want = run_interp(before, args, 2).float()
    assert ((got[0].float() - want).norm() / want.norm()).item() < 1e-3
    exact = a.float() @ b.float()
    assert ((got[0].float() - exact).norm() / exact.norm()).item() < 2e-3


@pytest.mark.parametrize("case, why", [
    (dict(K=160, block_K=32), "an odd count of k tiles"),
    (dict(K=256, block_K=64), "k tiles of 128 bytes already"),
    (dict(K=64, block_K=32), "two k tiles: one coarse iteration would leave nothing to ring"),
])
def test_left_as_written(case, why):
    kernel = lower(build_kernel(ws_matmul_program(128, 128, block_M=64, block_N=64, **case)), HOPPER)
    assert not coarsen_notes(kernel), why
    assert [s.buffer.static_shape[-1] for s in kernel.body.stmts
            if isinstance(s, ir.Alloc) and s.buffer.name == "A_s"] == [case["block_K"]], why


def test_kept_where_the_wider_ring_does_not_fit():
    narrow = lower(build_kernel(ws_matmul_program(1024, 1024, 1024)), AS_WRITTEN_K)
    room = narrow.find_plan(SharedMemoryPlan).total_bytes
    kept = lower(build_kernel(ws_matmul_program(1024, 1024, 1024)), HOPPER.replace(smem_bytes=room))
    [note] = coarsen_notes(kept)
    assert "keeps its k tiles" in note and f"more than the {room}" in note
    assert slots(kept)["A_s"] == 4
