"""merge_releases: ring slots a role releases at the same point share one barrier.

* The attention backward's consumer releases its Q and dO ring slots together after its final
  wait (overlap_gemms's placement): one arrival on one barrier instead of two, the producer's
  waits for both groups on that barrier, the other barrier gone. On sm_90a the D64 loop has 4
  ``BAR.SYNC`` instead of 5 (Triton puts a barrier between two arrivals; checked with
  nvdisasm where Triton bundles it). The lowered program still gives the float64 gradients on
  the interpreter under several role schedules.
* With the policy off (``TILEWS_MERGE_RELEASES=off``) the two arrivals stay; the forward's K and
  V releases, at different points, are never merged.
* D64's consumer split in one role per warp group (``split_partials``, the default): each role
  releases the merged slots by its one arrival.

The merged-role tests lower with ``split_partials`` off (``MERGED``): the one consumer role of two
warp groups that D128 (and ``TILEWS_SPLIT_PARTIALS=off``) keep.
"""
from __future__ import annotations

import dataclasses

import pytest

import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.traverse import walk
from tilews.ops.attention import mha_fwd_program
from tilews.ops.attention_backward import blocks, bwd_program
from tilews.triton_ext import toolchain
from tilews.triton_ext.gluon.backend import HOPPER

from ..helpers import gluon_program, innermost_loops
from .test_overlap_gemms import backward_matches_float64


MERGED = HOPPER.replace(split_partials=False)


def _backward(dim=64, seq=256, **change):
    return build_kernel(bwd_program(1, 2, 2, seq, dim, False, seq, dtype=T.float16,
                                    **dict(blocks(dim, True), **change)))


def _barrier_ops(kernel: ir.Kernel) -> dict:
    """role warp groups -> [(op, barrier name)] of its waits and arrivals, in order."""
    ws = next(s for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize))
    return {r.warpgroups: [(type(s).__name__, s.barrier.buffer.name) for s in walk(r.body)
                           if isinstance(s, (ir.BarrierWait, ir.BarrierArrive))]
            for r in ws.roles}


def test_backward_releases_q_and_do_slots_by_one_arrival():
    kernel = lower(_backward(), MERGED.replace(num_sms=132))
    ops = _barrier_ops(kernel)
    consumer = ops[(1, 2)]
    assert [b for op, b in consumer if op == "BarrierArrive" and b.startswith("empty")] == ["empty_dO_s"]
    assert [b for op, b in ops[(0,)] if op == "BarrierWait" and b.startswith("empty")] == \
        ["empty_dO_s", "empty_dO_s"]
    names = {s.buffer.name for s in kernel.body.stmts if isinstance(s, ir.Alloc)}
    assert "empty_Q_s" not in names and "empty_dO_s" in names
    assert any(n.startswith("merge_releases:") for n in kernel.notes)


def test_off_keeps_one_barrier_per_slot_group():
    config = dataclasses.replace(MERGED, policy=dataclasses.replace(MERGED.policy, merge_releases=False))
    consumer = _barrier_ops(lower(_backward(), config))[(1, 2)]
    assert [b for op, b in consumer if op == "BarrierArrive" and b.startswith("empty")] == \
        ["empty_dO_s", "empty_Q_s"]


def test_split_roles_each_release_the_merged_slots_once():
    ops = _barrier_ops(lower(_backward(), HOPPER.replace(num_sms=132)))
    for role in ((1,), (2,)):
        assert [b for op, b in ops[role] if op == "BarrierArrive"] == ["empty_dO_s"]
    assert [b for op, b in ops[(0,)] if op == "BarrierWait" and b.startswith("empty")] == \
        ["empty_dO_s", "empty_dO_s"]


def test_forward_releases_at_different_points_stay_apart():
    kernel = lower(build_kernel(mha_fwd_program(1, 2, 512, 64, False, dtype=T.float16)), HOPPER)
    assert not any(n.startswith("merge_releases:") for n in kernel.notes)


@pytest.mark.parametrize("seed", [0, 1])
def test_merged_backward_matches_float64_on_the_interpreter(seed):
    kernel = lower(_backward(64, 256), HOPPER.replace(num_sms=2))
    assert any(n.startswith("merge_releases:") for n in kernel.notes)
    backward_matches_float64(kernel, 64, 256, seed)


def _loop_barriers(sass: str) -> int:
    """``BAR.SYNC``s in the innermost sm_90a loop holding wgmmas (the consumer's)."""
    body = min((b for b in innermost_loops(sass) if sum(op.startswith("HGMMA") for op in b) >= 20),
               key=len)
    return sum(op.startswith("BAR.SYNC") for op in body)


@pytest.mark.parametrize("merge", [True, False])
def test_sm90a_loop_has_one_barrier_fewer(merge):
    config = HOPPER.replace(num_sms=132)
    config = dataclasses.replace(config, policy=dataclasses.replace(config.policy, merge_releases=merge))
    sass = toolchain.sass(gluon_program(lower(_backward(seq=4096), config)).asm["ptx"])
    if sass is None:
        pytest.skip("this Triton bundles no ptxas / cuobjdump")
    assert _loop_barriers(sass) == (4 if merge else 5)
