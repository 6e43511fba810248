"""warp_specialize's ring depth: a warp-specialized loop that asks for fewer than two stages
(``T.Pipelined(..., num_stages=1)``, TileLang's request to its software pipeliner) gets a ring of
two slots where shared memory holds them, so the producer loads block k + 1 while the consumer
computes on block k; where two slots would not fit (the real placement: ``plan_buffers`` by
lifetime), first with the epilogue's stores staged through shared memory, then from registers,
it keeps one, and a note says which. Deeper rings are the program's own. Either way
the lowered program means what the program does (the interpreter as oracle)."""
from __future__ import annotations

import pytest
import torch

from examples.gemm import matmul
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import plan_buffers
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import PipelinePlan, SharedMemoryPlan
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from .. import test_decode_gluon as varlen_decode
from ..helpers import randn
from ..test_ws_oracle import assert_same_under_schedules, run_interp

M, N, K = 96, 64, 160


def gemm(num_stages):
    return matmul.fn(M, N, K, block_M=64, block_N=64, block_K=32, num_stages=num_stages)


def gemm_args():
    return [randn(M, K, dtype=torch.float16, seed=3), randn(K, N, dtype=torch.float16, seed=4),
            torch.empty(M, N, dtype=torch.float16)]


def ring_slots(kernel: ir.Kernel) -> dict[str, int]:
    """Each ring buffer's slots (its leading dimension)."""
    rings = kernel.find_plan(PipelinePlan).ring_buffers
    return {s.buffer.name: s.buffer.static_shape[0] for s in walk(kernel.body)
            if isinstance(s, ir.Alloc) and s.buffer.name in rings}


def depth_notes(kernel: ir.Kernel) -> list[str]:
    return [n for n in kernel.notes if n.startswith("warp_specialize: the T.Pipelined loop")]


def check_numerics(lowered, args):
    got = run_interp(lowered, args, 2).double()
    want = args[0].double() @ args[1].double()
    assert torch.allclose(got, want, atol=2e-2, rtol=1e-2), (got - want).abs().max()


@pytest.mark.parametrize("num_stages", [0, 1])
def test_one_stage_gets_two_ring_slots(num_stages):
    args = gemm_args()
    lowered = assert_same_under_schedules(gemm(num_stages), args, 2)
    assert ring_slots(lowered) == {"A_s": 2, "B_s": 2}
    assert lowered.find_plan(PipelinePlan).stages == 2
    barriers = {s.buffer.name: s.buffer.static_shape[0] for s in walk(lowered.body)
                if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER}
    assert barriers == {"full": 2, "empty": 2}
    [note] = depth_notes(lowered)
    assert f"(num_stages={num_stages}) gets a ring of 2 slots" in note, note
    assert f"({lowered.find_plan(SharedMemoryPlan).total_bytes} bytes" in note, note
    check_numerics(lowered, args)


@pytest.mark.parametrize("num_stages", [2, 3])
def test_deeper_rings_are_the_programs(num_stages):
    lowered = lower(build_kernel(gemm(num_stages)), HOPPER)
    assert ring_slots(lowered) == {"A_s": num_stages, "B_s": num_stages}
    assert not depth_notes(lowered)


def staged_stores(kernel: ir.Kernel) -> list[str]:
    """The shared tiles warp_specialize staged epilogue stores through."""
    return [s.buffer.name for s in walk(kernel.body)
            if isinstance(s, ir.Alloc) and "_stage" in s.buffer.name]


def test_two_slots_by_storing_the_epilogue_from_registers():
    """Shared memory that holds the two-slot ring but not beside the epilogue's staging tile:
    the ring gets its two slots and the result is stored from registers (a slot serves every
    iteration, the staging tile one store), with a note; the meaning is unchanged."""
    two = lower(build_kernel(gemm(1)), HOPPER)
    assert staged_stores(two)
    target = HOPPER.replace(smem_bytes=two.find_plan(SharedMemoryPlan).total_bytes - 1)
    args = gemm_args()
    lowered = assert_same_under_schedules(gemm(1), args, 2, target=target)
    assert ring_slots(lowered) == {"A_s": 2, "B_s": 2}
    assert not staged_stores(lowered)
    assert any(n.startswith("warp_specialize: the epilogue stores from registers") for n in lowered.notes)
    check_numerics(lowered, args)


def test_one_slot_kept_where_two_exceed_shared_memory():
    """Shared memory that holds the one-slot form (its real placement) but not the two-slot one,
    even with its result stored from registers: the ring keeps one slot and the note gives the
    bytes two would need; the program still means the same on the interpreter under many
    schedules."""
    staged = lower(build_kernel(gemm(1)), HOPPER).find_plan(SharedMemoryPlan).total_bytes
    two = lower(build_kernel(gemm(1)), HOPPER.replace(smem_bytes=staged - 1)).find_plan(
        SharedMemoryPlan).total_bytes
    target = HOPPER.replace(smem_bytes=two - 1)
    args = gemm_args()
    lowered = assert_same_under_schedules(gemm(1), args, 2, target=target)
    assert ring_slots(lowered) == {"A_s": 1, "B_s": 1}
    assert lowered.find_plan(PipelinePlan).stages == 1
    assert lowered.find_plan(SharedMemoryPlan).total_bytes < two
    [note] = depth_notes(lowered)
    assert "(num_stages=1) keeps a ring of 1 slot" in note, note
    assert f"2 slots would need {two} bytes of shared memory, more than the {two - 1}" in note, note
    check_numerics(lowered, args)


def test_depth_is_judged_by_the_real_placement():
    """The bytes the rule weighs are plan_buffers' placement after the passes between
    (registerize keeps GQA decode's score maxima and sinks in registers), not the sum of the
    buffers warp_specialize allocates: a target holding only the former keeps two slots."""
    kernel = build_kernel(varlen_decode.program())
    specialized = lower(kernel, HOPPER, upto="warp_specialize")
    summed = SharedMemoryPlan.of(specialized.body).total_bytes
    placed = lower(kernel, HOPPER).find_plan(SharedMemoryPlan).total_bytes
    assert placed < summed
    tight = lower(kernel, HOPPER.replace(smem_bytes=placed))
    assert ring_slots(tight) == {"k_s": 2, "v_s": 2}
    [note] = depth_notes(tight)
    assert "(num_stages=1) gets a ring of 2 slots" in note and f"({placed} bytes" in note, note
    assert plan_buffers.place(tight).total_bytes == placed
