"""fold_zero_fill on attention's masked S: what it makes of the consumer, that the program means
the same afterwards, that a wrong flag is caught, and the shapes it must leave alone."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tilews.lowering import ir
from tilews.lowering.errors import UninitializedReadError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import fold_zero_fill, lower
from tilews.lowering.target import HOPPER
from tilews.lowering.traverse import transform, walk
from tilews.ops.attention import mha_fwd_program

from ..helpers import randn
from ..test_ws_oracle import run_interp

B, H, S, D = 1, 2, 200, 64


def program(causal):
    return mha_fwd_program(B, H, S, D, causal, block_M=128, block_N=64, num_stages=2, threads=256)


@functools.lru_cache(maxsize=None)
def before(causal):
    """Lowered up to the pass (instructions decided), as the pass sees it."""
    return lower(build_kernel(program(causal)), HOPPER, upto="legalize_wgmma")


def inputs(seed=0):
    q, k, v = (randn(B, H, S, D, dtype=torch.float16, seed=seed + i) for i in range(3))
    return [q, k, v, torch.empty(B, H, S, D, dtype=torch.float16)]


def qk_gemms(k):
    return [g for g in walk(k.body) if isinstance(g, ir.Gemm) and g.a.buffer.name == "Q_shared"]


def s_fills(k):
    return [f for f in walk(k.body) if isinstance(f, ir.Fill) and f.dst.buffer.name.startswith("acc_s")]


@pytest.mark.parametrize("causal", [False, True])
def test_masked_scores_are_never_zeroed(causal):
    k0 = before(causal)
    assert s_fills(k0) and all(g.accumulate_if is None for g in qk_gemms(k0))
    k1 = fold_zero_fill.run(k0, HOPPER)
    assert any(n.startswith("fold_zero_fill:") for n in k1.notes)
    assert not s_fills(k1)
    for g in qk_gemms(k1):       # adds into S only where the block masks (the if's condition)
        assert g.accumulate_if is not None and not g.clear_accum
        guard = next(s for s in walk(k1.body) if isinstance(s, ir.If) and s.cond == g.accumulate_if)
        assert any(isinstance(t, ir.Parallel) for t in walk(guard.then)) and not guard.orelse.stmts
    args = inputs()
    want = run_interp(build_kernel(program(causal)), args, 3)
    for seed in range(6):
        assert torch.equal(run_interp(k1, args, 3, seed), want), seed


def test_inverted_flag_is_caught():
    k1 = fold_zero_fill.run(before(True), HOPPER)
    wrong = transform(k1, lambda n: dataclasses.replace(n, accumulate_if=ir.UnOp(
        ir.UnOpKind.NOT, n.accumulate_if, ir.DType.BOOL, n.loc))
        if isinstance(n, ir.Gemm) and n.accumulate_if is not None else None)
    # the first unmasked block adds Q K^T into an S nothing wrote: the interpreter stops there
    with pytest.raises(UninitializedReadError, match="acc_s"):
        run_interp(wrong, inputs(1), 3)


def _edit_branch(k, fn):
    """``k`` with ``fn`` applied to every ``if`` that holds a fill of S."""
    return transform(k, lambda n: fn(n) if isinstance(n, ir.If) and any(
        isinstance(t, ir.Fill) and t.dst.buffer.name.startswith("acc_s") for t in walk(n)) else None)


def test_fill_in_the_else_branch_folds_too():
    swapped = _edit_branch(before(True), lambda n: ir.If(ir.UnOp(ir.UnOpKind.NOT, n.cond, ir.DType.BOOL, n.loc),
                                                         n.orelse, n.then, n.loc))
    k1 = fold_zero_fill.run(swapped, HOPPER)
    assert not s_fills(k1) and all(g.accumulate_if is not None for g in qk_gemms(k1))
    args = inputs(2)
    assert torch.equal(run_interp(k1, args, 3), run_interp(build_kernel(program(True)), args, 3))


@pytest.mark.parametrize("edit", ["nonzero", "partial"])
def test_fills_it_must_keep(edit):
    def change(n):
        fill = n.then.stmts[0]
        if edit == "nonzero":
            fill = dataclasses.replace(fill, value=ir.Const(1.0, fill.value.dtype, fill.loc))
        else:
            half = dataclasses.replace(fill.dst, extents=(fill.dst.extents[0] // 2,) + fill.dst.extents[1:])
            fill = dataclasses.replace(fill, dst=half)
        return dataclasses.replace(n, then=ir.Seq((fill,), n.then.loc))
    k1 = fold_zero_fill.run(_edit_branch(before(True), change), HOPPER)
    assert s_fills(k1) and all(g.accumulate_if is None for g in qk_gemms(k1))


def test_not_on_other_targets():
    from tilews.lowering.target import TRITON_GPU
    k = lower(build_kernel(program(True)), TRITON_GPU)
    assert s_fills(k) and all(g.accumulate_if is None for g in walk(k.body) if isinstance(g, ir.Gemm))
