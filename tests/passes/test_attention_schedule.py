"""split_consumers and overlap_softmax on attention: what each makes of the consumer, that the
program means the same afterwards (interpreter, random schedules), and the wrong rewrites each
rule exists to prevent, caught."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tilews.lowering import ir, verify_async
from tilews.lowering.errors import CompileError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.layouts import WgmmaAccumulator
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import LayoutPlan
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import exprs_of, subexprs, transform, walk
from tilews.ops.attention import mha_fwd_program
from examples.attention import reference

from ..helpers import randn, rel_err, roles
from ..test_ws_oracle import run_interp

B, H, S, D = 1, 2, 200, 64          # 200: the last key block is ragged


def program(causal):
    return mha_fwd_program(B, H, S, D, causal, block_M=128, block_N=64, num_stages=2, threads=256)


@functools.lru_cache(maxsize=None)
def lowered(causal, split=True, overlap=False):
    target = HOPPER.replace(split_consumers=split, overlap_softmax=overlap)
    return lower(build_kernel(program(causal)), target)


def inputs(seed=0):
    q, k, v = (randn(B, H, S, D, dtype=torch.float16, seed=seed + i) for i in range(3))
    return [q, k, v, torch.empty(B, H, S, D, dtype=torch.float16)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("split,overlap", [(True, False), (False, True), (True, True)])
def test_schedules_mean_the_program(causal, split, overlap):
    args = inputs()
    want = run_interp(build_kernel(program(causal)), args, 3)
    assert rel_err(want, reference(*args[:3], causal)) < 1e-2
    after = lowered(causal, split, overlap)
    for seed in range(8):
        assert torch.equal(run_interp(after, args, 3, seed), want), seed


def test_split_gives_each_warp_group_its_rows():
    k = lowered(True)
    rs = roles(k)
    assert set(rs) == {(0,), (1,), (2,)}
    assert any("split_consumers: the consumer's 128 rows" in n for n in k.notes)
    layouts = dict(k.plan(LayoutPlan).layouts)
    for h in (0, 1):
        acc = layouts[f"acc_o_{h}"]
        assert isinstance(acc, WgmmaAccumulator) and acc.warps_per_cta == (4, 1)
        gemm = next(s for s in walk(rs[(h + 1,)].body) if isinstance(s, ir.Gemm)
                    and s.a.buffer.name == "Q_shared")
        assert ir.as_int(gemm.a.starts[0]) == 64 * h and gemm.a.extents[0] == 64
        store = next(s for s in walk(rs[(h + 1,)].body) if isinstance(s, ir.Copy)
                     and s.dst.buffer.scope is ir.Scope.GLOBAL)
        assert store.dst.extents[2] == 64
    # the causal mask reads the true query row: i + 64 in the second half
    mask = [s for s in walk(rs[(2,)].body) if isinstance(s, ir.Parallel) and len(s.vars) == 2
            and any(isinstance(t, ir.Store) and isinstance(t.value, ir.Select) for t in walk(s.body))][0]
    i = mask.vars[0]
    shifted = ir.BinOp(ir.BinOpKind.ADD, i, ir.Const(64, ir.DType.I32), ir.DType.I32)
    assert any(x == shifted for st in walk(mask.body) for e in exprs_of(st) for x in subexprs(e))
    assert mask.extents == (64, 64)


def test_split_with_the_row_shift_dropped_is_caught():
    """The second half's parallel loops index the global row with i instead of i + 64: the causal
    mask then masks the wrong keys, and the oracle sees it."""
    k = lowered(True)
    rs = roles(k)
    second = rs[(2,)]

    def unshift(n):
        if isinstance(n, ir.BinOp) and n.op is ir.BinOpKind.ADD and ir.as_int(n.b) == 64 \
                and isinstance(n.a, ir.Var) and n.a.kind is ir.VarKind.PARALLEL:
            return n.a
        return None
    wrong_role = dataclasses.replace(second, body=transform(second.body, unshift))
    ws = next(s for s in k.body.stmts if isinstance(s, ir.WarpSpecialize))
    wrong_ws = dataclasses.replace(ws, roles=tuple(wrong_role if r is second else r for r in ws.roles))
    wrong = dataclasses.replace(k, body=ir.Seq(tuple(wrong_ws if s is ws else s for s in k.body.stmts)))
    args = inputs(1)
    want = run_interp(build_kernel(program(True)), args, 3)
    assert not torch.equal(run_interp(wrong, args, 3), want)


def test_a_block_level_atomic_keeps_one_merged_consumer():
    """One add per block: split roles would each run it (the oracle would see O[0, 0, 0, 0]
    grow by two)."""
    before = build_kernel(program(False))
    out = next(p for p in before.params if p.name == "Output")
    zero = ir.Const(0, ir.DType.I32)
    add = ir.AtomicAdd(ir.Region(out, (zero,) * 4, (1, 1, 1, 1)), ir.Const(1.0, ir.DType.F16),
                       loc=before.body.stmts[-1].loc)
    before = dataclasses.replace(before, body=ir.Seq(before.body.stmts + (add,), before.body.loc))
    k = lower(before, HOPPER)
    assert set(roles(k)) == {(0,), (1, 2)}
    assert any("is one per block; 2 roles would each add" in n for n in k.notes), k.notes
    args = inputs(2)
    assert torch.equal(run_interp(k, args, 3), run_interp(before, args, 3))


def test_plain_gemm_keeps_one_merged_consumer():
    from examples.gemm import matmul
    k = lower(build_kernel(matmul.fn(256, 256, 128, block_M=128, block_N=128, block_K=64,
                                     num_stages=2, threads=256)), HOPPER)
    assert (1, 2) in roles(k)
    assert any("no fragment math to overlap" in n for n in k.notes)


def _loop(k):
    body = roles(k)[(1,)].body.stmts
    return body, next(s for s in body if isinstance(s, ir.For))


def test_overlap_defers_p_v_under_the_next_softmax():
    k = lowered(False, split=True, overlap=True)
    assert any(n.startswith("overlap_softmax:") for n in k.notes)
    body, loop = _loop(k)
    stmts = loop.body.stmts
    kinds = [type(s).__name__ for s in stmts]
    gemms = [i for i, s in enumerate(stmts) if isinstance(s, ir.Gemm)]
    waits = [i for i, s in enumerate(stmts) if isinstance(s, ir.GemmWait)]
    # Q K^T of block k + 1, then P V of block k (the loop variable is the previous block), then
    # wait(1): S is complete, P V still in flight; the softmax; wait(0). P of block k (and O's
    # rescale) come first, right before the gemms: nothing branches between P and P V
    qk, pv = (stmts[i] for i in gemms)
    assert qk.a.buffer.name == "Q_shared" and pv.a.buffer.name.startswith("acc_s_cast")
    assert [stmts[i].outstanding for i in waits] == [1, 0] and gemms[1] < waits[0]
    first_reduce = kinds.index("Reduce")
    cast = next(i for i, s in enumerate(stmts) if isinstance(s, ir.Copy)
                and s.dst.buffer.name.startswith("acc_s_cast"))
    assert cast < gemms[0] < waits[0] < first_reduce < waits[1]
    i32 = ir.DType.I32
    nxt = ir.BinOp(ir.BinOpKind.ADD, loop.var, ir.Const(1, i32), i32)
    assert qk.b.starts[0] == ir.BinOp(ir.BinOpKind.MOD, nxt, ir.Const(2, i32), i32)
    assert pv.b.starts[0] == ir.BinOp(ir.BinOpKind.MOD, loop.var, ir.Const(2, i32), i32)
    # K's stage is released after wait(1), V's after wait(0)
    arrives = {s.barrier.buffer.name: i for i, s in enumerate(stmts) if isinstance(s, ir.BarrierArrive)}
    assert waits[0] < arrives["empty_K_shared"] < first_reduce < waits[1] < arrives["empty_V_shared"]
    # the first block's Q K^T before the loop, the last block's P V after it
    outside = [s for s in body if s is not loop for t in walk(s) if isinstance(t, ir.Gemm)]
    assert len(outside) == 2


@pytest.mark.parametrize("wrong", ["softmax_before_its_wait", "p_rewritten_in_flight"])
def test_deferred_p_v_without_its_waits_is_caught(wrong):
    """The asynchronous-gemm check refuses the program when the softmax reads S before the wait
    that completes Q K^T, or when P (the in-flight P V's register operand) is rewritten before
    the wait that completes P V."""
    k = lowered(False, split=True, overlap=True)
    body, loop = _loop(k)
    stmts = list(loop.body.stmts)
    waits = [i for i, s in enumerate(stmts) if isinstance(s, ir.GemmWait)]
    if wrong == "softmax_before_its_wait":      # wait(1) dropped: wait(0) comes after the softmax
        del stmts[waits[0]]
    else:                                       # P's cast moved after the P V that reads it
        gemms = [i for i, s in enumerate(stmts) if isinstance(s, ir.Gemm)]
        assert isinstance(stmts[0], ir.Copy) and stmts[0].dst.buffer.name.startswith("acc_s_cast")
        stmts.insert(gemms[1], stmts.pop(0))
    new_loop = dataclasses.replace(loop, body=ir.Seq(tuple(stmts), loop.body.loc))
    wrong_k = transform(k, lambda n: new_loop if n is loop else None)
    with pytest.raises(CompileError, match="before|in flight|wait"):
        verify_async.run(wrong_k)


def test_split_is_the_same_in_every_process():
    """The split roles' allocations follow the program's order, not a set's (string hashes differ
    per process): the emitted source, which keys the compiled-kernel cache, must not change from
    one process to the next."""
    import os
    import subprocess
    import sys
    code = ("from tests.passes.test_attention_schedule import lowered\n"
            "from tilews.lowering import printer\n"
            "print(printer.to_text(lowered(True)))\n")
    texts = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(texts) == 1 and "alloc acc_s_0" in texts.pop()
