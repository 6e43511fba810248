"""ring_handshakes: an explicit ``T.ws`` loop handing its shared tiles over through one
``data_is_ready`` / ``compute_is_done`` pair (TileLang's ``copy_0_gemm_1``, ``copy_1_gemm_0`` and
``softpipe_stage2`` examples, ``examples/ws_gemm.py``'s ``ws_matmul_program``) becomes a ring, so
the producer loads ahead and ``overlap_mma`` keeps the consumer's wgmma in flight: the schedule
of a warp-specialized GEMM at its best, not producer and consumer taking turns. Compile-only
checks read the lowered IR and the TTGIR/PTX for sm_90a at the examples' own block sizes; the
interpreter runs the lowered programs (the program as written is the oracle, under many
schedules) and compares with a float32 product. Loops that are not such a handshake, or whose
ring shared memory cannot hold, are left as written."""
from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch

from examples.ws_gemm import ws_matmul_program
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import SharedMemoryPlan
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from ..helpers import gluon_program, randn
from ..test_ws_oracle import AS_WRITTEN_K, assert_same_under_schedules, run_interp
from ..tilelang_compat.test_warp_specialize import PROGRAMS

ONE_SLOT = ["copy_0_gemm_1", "copy_1_gemm_0", "softpipe_stage2"]
H200 = HOPPER.replace(num_sms=132)


@functools.cache
def lowered_example(name: str) -> ir.Kernel:
    """TileLang's example ``name`` at 8192^3 with its main()'s blocks, lowered for an H200."""
    frontend = PROGRAMS[name]("hopper").compile(M=8192, N=8192, K=8192, block_M=128,
                                                block_N=128, block_K=64).ir_before
    return lower(frontend, H200)


@functools.cache
def asm(name: str) -> dict:
    return gluon_program(lowered_example(name)).asm


def slots(kernel: ir.Kernel) -> dict[str, int]:
    """The leading dimension of every shared buffer and barrier the program allocated itself."""
    return {s.buffer.name: s.buffer.static_shape[0] for s in walk(kernel.body)
            if isinstance(s, ir.Alloc) and s.buffer.scope in (ir.Scope.SHARED, ir.Scope.BARRIER)
            and not s.buffer.name.endswith("_stage0")}


def ring_notes(kernel: ir.Kernel) -> list[str]:
    return [n for n in kernel.notes if n.startswith("ring_handshakes:")]


def consumer_loop(kernel: ir.Kernel) -> ir.For:
    """The loop of the role that issues the gemms."""
    return next(s for r in walk(kernel.body) if isinstance(r, ir.Role)
                for s in r.body.stmts if isinstance(s, ir.For)
                and any(isinstance(t, ir.Gemm) for t in walk(s)))


@pytest.mark.parametrize("name", ONE_SLOT)
def test_one_slot_examples_get_the_ring_schedule(name):
    kernel = lowered_example(name)
    assert slots(kernel) == {"A_shared": 4, "B_shared": 4, "data_is_ready": 4,
                             "compute_is_done": 4}
    [note] = ring_notes(kernel)
    assert "hands A_shared, B_shared over" in note and "ring of 4 slots" in note, note
    assert f"{kernel.find_plan(SharedMemoryPlan).total_bytes} bytes of shared memory" in note, note
    # the consumer keeps one wgmma in flight and releases the slot read one iteration before
    waits = [s.outstanding for s in walk(consumer_loop(kernel)) if isinstance(s, ir.GemmWait)]
    assert waits == [1]
    ttgir, ptx = asm(name)["ttgir"], asm(name)["ptx"]
    assert re.findall(r"warp_group_dot_wait .*\{pendings = (\d+)", ttgir) == ["1", "0"]
    assert "memdesc<4x128x64xf16" in ttgir and "memdesc<4x64x128xf16" in ttgir
    assert re.findall(r"ttng\.init_barrier %\w+, (\d+)", ttgir) == ["1"] * 8
    # the producer waits for a slot's release, not for the previous iteration's gemm
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)
    assert len(re.findall(r"\b(ld|st)\.local\b", ptx)) == 0, "the kernel spills registers"


def test_the_two_slot_ring_of_barrierpipe_is_the_programs():
    kernel = lowered_example("barrierpipe_stage2")
    assert slots(kernel) == {"A_shared": 2, "B_shared": 2, "mbars": 4}
    assert not ring_notes(kernel)


@pytest.mark.parametrize("name", ONE_SLOT)
def test_lowered_examples_compute_the_product(name):
    """K spans six tiles: the ring of four wraps, so its barriers complete phases of both
    parities. The lowered program (its k tiles as written) equals the program as written under
    random schedules and the float32 product within fp16 rounding."""
    M, N, K = 128, 128, 192
    a, b = randn(M, K, dtype=torch.float16, seed=5), randn(K, N, dtype=torch.float16, seed=6)
    args = [a, b, torch.empty(M, N, dtype=torch.float16)]
    frontend = PROGRAMS[name]("interpret").compile(M=M, N=N, K=K, block_M=64, block_N=64,
                                                   block_K=32).ir_before
    after = assert_same_under_schedules(frontend, args, 2, seeds=range(4), target=AS_WRITTEN_K)
    assert slots(after)["A_shared"] == 4 and ring_notes(after)
    got = run_interp(after, args, 2, seed=7).float()
    want = a.float() @ b.float()
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_merged_consumer_of_ws_gemm():
    """examples/ws_gemm.py's explicit GEMM: a producer warp group and one consumer role of two
    (``done`` counts 256 arrivals): the same ring, four deep, the wgmma in flight."""
    M, N, K = 128, 128, 160
    a, b = randn(M, K, dtype=torch.float16, seed=8), randn(K, N, dtype=torch.float16, seed=9)
    args = [a, b, torch.empty(M, N, dtype=torch.float16)]
    after = assert_same_under_schedules(ws_matmul_program(M, N, K, block_M=64, block_N=64,
                                                          block_K=32),
                                        args, 2, seeds=range(4))
    assert slots(after) == {"A_s": 4, "B_s": 4, "ready": 4, "done": 4}
    assert [s.outstanding for s in walk(consumer_loop(after)) if isinstance(s, ir.GemmWait)] == [1]
    got = run_interp(after, args, 2).float()
    want = a.float() @ b.float()
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_ring_depth_follows_shared_memory_and_the_trip_count():
    big = lower(build_kernel(ws_matmul_program(1024, 1024, 1024, block_M=128, block_N=128,
                                               block_K=64)), HOPPER)
    four = big.find_plan(SharedMemoryPlan).total_bytes
    stage = (128 * 64 + 64 * 128) * 2
    # room for three slots, not four: three
    three = lower(build_kernel(ws_matmul_program(1024, 1024, 1024, block_M=128, block_N=128,
                                                 block_K=64)), HOPPER.replace(smem_bytes=four - 1))
    assert slots(three)["A_s"] == 3
    assert "4 slots would need" not in " ".join(ring_notes(three))
    # room for one slot only: kept as written, with the bytes two would need (two tiles and
    # two barrier pairs fewer than four)
    two = four - 2 * stage - 2 * 2 * 8
    tight = HOPPER.replace(smem_bytes=two - 1)
    kept = lower(build_kernel(ws_matmul_program(1024, 1024, 1024, block_M=128, block_N=128,
                                                block_K=64)), tight)
    assert slots(kept)["A_s"] == 128
    [note] = ring_notes(kept)
    assert "kept as written" in note and f"2 slots would need {two} bytes" in note
    # two k tiles: a ring of two is all the loop can use
    short = lower(build_kernel(ws_matmul_program(256, 256, 128, block_M=128, block_N=128,
                                                 block_K=64)), HOPPER)
    assert slots(short)["A_s"] == 2


def not_a_handshake(variant: str) -> ir.Kernel:
    """examples/ws_gemm.py's program changed where the ring would change what it computes: the
    consumer reads the tiles again after the loop (``tail_reads_tile``: they must hold the last
    k tile), or writes one of them in the loop (``consumer_writes_tile``: the producer's next
    fill is ordered after that write only through the single slot)."""
    kernel = build_kernel(ws_matmul_program(128, 128, 128, block_M=64, block_N=64, block_K=32))
    loop = next(s for s in kernel.body.stmts if isinstance(s, ir.For))
    gemm = next(s for s in walk(loop) if isinstance(s, ir.Gemm))
    load_b = [s for s in walk(loop) if isinstance(s, ir.Copy)][-1]

    def edit(s):
        if variant == "tail_reads_tile" and s is kernel.body.stmts[-1]:
            return dataclasses.replace(s, body=ir.Seq((gemm, *s.body.stmts), s.loc))
        if variant == "consumer_writes_tile" and s is loop:
            consumer = loop.body.stmts[-1]
            wait, mm, arrive = consumer.body.stmts
            body = ir.Seq((wait, mm, load_b, arrive), consumer.loc)
            return dataclasses.replace(loop, body=ir.Seq(
                (*loop.body.stmts[:-1], dataclasses.replace(consumer, body=body)), loop.loc))
        return s
    stmts = tuple(edit(s) for s in kernel.body.stmts)
    return dataclasses.replace(kernel, body=dataclasses.replace(kernel.body, stmts=stmts))


@pytest.mark.parametrize("variant", ["tail_reads_tile", "consumer_writes_tile"])
def test_not_a_handshake_is_left_alone(variant):
    kernel = lower(not_a_handshake(variant), HOPPER)
    assert slots(kernel)["A_s"] == 64 and not ring_notes(kernel)
