"""pingpong: split consumer warp groups take turns issuing their gemms. What the pass makes of
attention's consumers (two and three warp groups), that the program means the same afterwards
(interpreter, random schedules), that a wrong turn order deadlocks where the interpreter sees it,
and what Triton compiles for sm_90a."""
from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch

from tilews.lowering import ir
from tilews.lowering.errors import DeadlockError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, SharedMemoryPlan
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import transform, walk
from tilews.ops.attention import mha_fwd_program
from examples.attention import reference

from ..helpers import gluon_program, randn, rel_err
from ..test_ws_oracle import run_interp

PINGPONG = HOPPER.replace(pingpong=True)
B, H, S, D = 1, 2, 200, 64          # 200: the last key block is ragged


def program(causal, block_M=128, threads=256, seq_len=S):
    return mha_fwd_program(B, H, seq_len, D, causal, block_M=block_M, block_N=64, num_stages=2,
                           threads=threads)


@functools.lru_cache(maxsize=None)
def lowered(causal, block_M=128, threads=256, target=PINGPONG):
    return lower(build_kernel(program(causal, block_M, threads)), target)


def inputs(seed=0, seq_len=S):
    q, k, v = (randn(B, H, seq_len, D, dtype=torch.float16, seed=seed + i) for i in range(3))
    return [q, k, v, torch.empty(B, H, seq_len, D, dtype=torch.float16)]


def consumers(kernel):
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    return [r for r in ws.roles if r.warpgroups != (0,)]


def events(role):
    """The role's turn waits, gemms and turn arrivals in program order, as ('wait', index,
    parity), ('gemm',), ('arrive', index)."""
    out = []
    for s in walk(role.body):
        if isinstance(s, ir.BarrierWait) and s.barrier.buffer.name == "turns":
            out.append(("wait", ir.as_int(s.barrier.index), s.parity))
        elif isinstance(s, ir.BarrierArrive) and s.barrier.buffer.name == "turns":
            out.append(("arrive", ir.as_int(s.barrier.index)))
        elif isinstance(s, ir.Gemm):
            out.append(("gemm",))
    return out


@pytest.mark.parametrize("block_M,threads", [(128, 256), (192, 384)])
def test_each_issue_is_one_turn(block_M, threads):
    """Role h waits for turns[h] before its first gemm of an issue and passes the turn to role
    h + 1 (mod n) after its last; every gemm is inside a turn; role 0's parity is flipped (it
    goes first on fresh barriers); the barriers and counters are in the plans."""
    k = lowered(True, block_M, threads)
    cons = consumers(k)
    n = len(cons)
    assert n == block_M // 64 and any(note.startswith("pingpong:") for note in k.notes)
    for h, r in enumerate(cons):
        ev = events(r)
        inside = False
        for e in ev:
            if e[0] == "wait":
                assert not inside and e[1] == h
                parity = e[2]
                assert isinstance(parity, ir.BinOp) and (parity.op is ir.BinOpKind.XOR) == (h == 0)
                inside = True
            elif e[0] == "arrive":
                assert inside and e[1] == (h + 1) % n
                inside = False
            else:
                assert inside, f"role {h}: a gemm outside a turn"
        # prologue (Q K^T), loop (Q K^T and the deferred P V), epilogue (the last P V)
        assert [e[0] for e in ev].count("wait") == 3
        first = r.body.stmts[0]
        assert isinstance(first, ir.Store) and first.buffer.name == f"turns_{h}" and ir.as_int(first.value) == 0
    plan = k.plan(AsyncPlan)
    assert dict(plan.barrier_counts)["turns"] == (1,) * n
    assert {name for name, _ in plan.scalar_locals} >= {f"turns_{h}" for h in range(n)}
    ranges = {name: (off, size) for name, off, size in k.plan(SharedMemoryPlan).ranges}
    assert ranges["turns"][1] == 8 * n and sum(ranges["turns"]) == k.plan(SharedMemoryPlan).total_bytes


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_M,threads", [(128, 256), (192, 384)])
def test_turns_mean_the_program(causal, block_M, threads):
    seq_len = 200 if block_M == 128 else 400          # three 192-row blocks, the last ragged
    args = inputs(3, seq_len)
    before = build_kernel(program(causal, block_M, threads, seq_len))
    want = run_interp(before, args, 3)
    assert rel_err(want, reference(*args[:3], causal)) < 1e-2
    after = lower(before, PINGPONG)
    assert any(note.startswith("pingpong:") for note in after.notes)
    for seed in range(6):
        assert torch.equal(run_interp(after, args, 3, seed), want), seed


def test_a_turn_passed_to_the_wrong_role_deadlocks():
    """Role 0 hands the turn back to itself: role 1 never gets one, and the interpreter reports
    the deadlock instead of running on."""
    k = lowered(False)
    r0 = consumers(k)[0]

    def to_self(n):
        if isinstance(n, ir.BarrierArrive) and n.barrier.buffer.name == "turns":
            return dataclasses.replace(n, barrier=dataclasses.replace(n.barrier, index=ir.Const(0, ir.DType.I32)))
        return None
    wrong_role = dataclasses.replace(r0, body=transform(r0.body, to_self))
    ws = next(s for s in k.body.stmts if isinstance(s, ir.WarpSpecialize))
    wrong_ws = dataclasses.replace(ws, roles=tuple(wrong_role if r is r0 else r for r in ws.roles))
    wrong = dataclasses.replace(k, body=ir.Seq(tuple(wrong_ws if s is ws else s for s in k.body.stmts)))
    with pytest.raises(DeadlockError, match="turns"):
        run_interp(wrong, inputs(), 3)


def test_off_by_default_and_only_for_split_consumers():
    assert not HOPPER.policy.pingpong
    k = lowered(True, target=HOPPER)
    assert not any(isinstance(s, ir.Alloc) and s.buffer.name == "turns" for s in walk(k.body))
    merged = lowered(True, target=PINGPONG.replace(split_consumers=False))
    assert not any(note.startswith("pingpong:") for note in merged.notes)
    from examples.gemm import matmul
    gemm = lower(build_kernel(matmul.fn(256, 256, 128, block_M=128, block_N=128, block_K=64,
                                        num_stages=2, threads=256)), PINGPONG)
    assert not any(note.startswith("pingpong:") for note in gemm.notes)


def test_compiles_for_sm90a():
    """Triton takes the turns: one mbarrier per role besides Q's and the K/V rings', and each
    role's issues wait and arrive on them around its wgmma."""
    k = lowered(True)
    p = gluon_program(k)
    src, ptx = p.source, p.asm["ptx"]
    assert len(re.findall(r"mbarrier\.init\.shared::cta\.b64", ptx)) == 1 + 2 * 2 * 2 + 2
    for h in range(2):
        parity = r"\(turns_0 & 1\) \^ 1" if h == 0 else r"turns_1 & 1"
        assert len(re.findall(rf"mbarrier\.wait\(turns\.index\({h}\), {parity}\)", src)) == 3
        assert len(re.findall(rf"mbarrier\.arrive\(turns\.index\({1 - h}\), count=1\)", src)) == 3
    assert re.search(r"wgmma\.mma_async", ptx)
