"""An attention program with its schedule written out (``examples/attention.py``'s
``ws_mha_fwd_program``: a ``T.ws`` producer and two consumers, their barriers) gets what the
compiler gives the same computation written with ``T.Pipelined`` (issue 41):

* ``mask_after_gemm`` across the consumer's wait for K and its release of K: ``S = Q K^T`` then
  the mask, so the wgmma overwrites S;
* ``uniform_selects`` on the mask's ``and`` of the causal condition and the key-length bound:
  blocks below the diagonal run unmasked;
* ``longest_first`` on the roles' key-block loops: the longest query blocks start first.

Compile-only on Hopper (notes, SASS: its causal loop no longer than the ``T.Pipelined`` op's), the
lowered program on the interpreter (concurrent roles, races checked) against float64 SDPA, with a
ragged last key block; ``uniform_selects`` on an ``and`` also on its own, before and after.
"""
from __future__ import annotations

import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import uniform_selects
from tilews.lowering.pipeline import lower
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from examples.attention import ws_mha_fwd_program

from .helpers import innermost_loops, poisoned, randn
from .test_ws_oracle import run_interp

NOTES = ("mask_after_gemm: the T.gemm at line", "uniform_selects: the T.Parallel loop at line",
         "overlap_softmax: in the loop")


def explicit(seq, dim, causal, block, batch=1, heads=2):
    return build_kernel(ws_mha_fwd_program(batch, heads, seq, dim, causal, block_M=block, block_N=block,
                                           stages=2, dtype=T.float16))


def _reference(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            is_causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_explicit_program_gets_the_pipelined_forms_passes(causal):
    lowered = lower(explicit(4096, 64, causal, 128, batch=8, heads=16), HOPPER.replace(num_sms=132))
    for note in NOTES:
        assert any(n.startswith(note) for n in lowered.notes), (note, lowered.notes)
    first = [n for n in lowered.notes if n.startswith("longest_first:")]
    if causal:
        assert first and "the role's loop at line" in first[0] and "bx -> 31 - bx" in first[0], lowered.notes
    else:
        assert not first, lowered.notes


def test_explicit_causal_loop_is_no_longer_than_the_ops():
    """SASS of the consumers' key-block loop (sm_90a): the explicit program's against
    ``tilews.ops.attention``'s kernel at D64 (the mask before Q K^T as written: 772 instructions;
    the op's 648)."""
    import tilews
    from tilews.ops.attention import mha_fwd
    from tilews.triton_ext.toolchain import sass
    ex = tilews.jit(target="hopper")(ws_mha_fwd_program)(8, 16, 2048, 64, True, block_M=128,
                                                         block_N=128, stages=2, dtype=T.bfloat16)
    op = tilews.jit(target="hopper")(mha_fwd.fn)(8, 16, 2048, 64, True, layout="bhsd", dtype=T.bfloat16,
                                                 block_M=128, block_N=128, num_stages=2, threads=256)
    code = {name: sass(k.asm["ptx"]) for name, k in (("explicit", ex), ("op", op))}
    if None in code.values():
        pytest.skip("this Triton bundles no ptxas / cuobjdump")
    longest = {name: max(len(loop) for loop in innermost_loops(s)) for name, s in code.items()}
    assert longest["explicit"] <= longest["op"], longest


@pytest.mark.parametrize("causal", [False, True])
def test_lowered_explicit_program_matches_float64(causal):
    """200 keys in 64-row blocks: the last key block is ragged; causal blocks lie below, on and
    past the diagonal."""
    seq = 200
    lowered = lower(explicit(seq, 64, causal, 64), HOPPER.replace(num_sms=3))
    for note in NOTES[:2]:
        assert any(n.startswith(note) for n in lowered.notes), (note, lowered.notes)
    q, k, v = (randn(1, 2, seq, 64, dtype=torch.float16, seed=40 + i) for i in range(3))
    out = poisoned(1, 2, seq, 64, dtype=torch.float16)
    interpreter.run(lowered, [q, k, v, out], seed=int(causal))
    torch.testing.assert_close(out.double(), _reference(q, k, v, causal), atol=2e-3, rtol=2e-3)


def banded(n, block, lo, hi):
    """out[r, c] = x[r, c] where lo <= c - r (the causal side) and c - r < hi, else -1: a mask that
    is an ``and`` of two comparisons, each uniform over some tiles."""
    @T.prim_func
    def main(X: T.Tensor((n, n), T.float32), Out: T.Tensor((n, n), T.float32)):
        with T.Kernel(T.ceildiv(n, block), T.ceildiv(n, block), threads=128) as (bx, by):
            f = T.alloc_fragment((block, block), T.float32)
            T.copy(X[by * block, bx * block], f)
            for i, j in T.Parallel(block, block):
                f[i, j] = T.if_then_else((bx * block + j - (by * block + i) >= lo)
                                         and (bx * block + j - (by * block + i) < hi), f[i, j], -1.0)
            T.copy(f, Out[by * block, bx * block])
    return main


def test_an_and_of_uniform_comparisons_branches_and_keeps_each_element():
    n, block, lo, hi = 96, 32, -20, 40
    kernel = build_kernel(banded(n, block, lo, hi))
    after = uniform_selects.run(kernel, HOPPER)
    assert any(n.startswith("uniform_selects:") for n in after.notes), after.notes
    branches = [s for s in walk(after.body) if isinstance(s, ir.If)]
    assert branches and branches[0].cond.op is ir.BinOpKind.LAND, branches[0].cond     # holds everywhere
    assert branches[1].cond.op is ir.BinOpKind.LOR, branches[1].cond                    # fails everywhere
    x = randn(n, n, seed=5)
    rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
    want = torch.where((cols - rows >= lo) & (cols - rows < hi), x, torch.full_like(x, -1.0))
    for k in (kernel, after):
        torch.testing.assert_close(run_interp(k, [x, torch.empty(n, n)], 1), want)
