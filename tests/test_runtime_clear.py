"""``runtime_clear``: where a branch zeroes a gemm's accumulator just before the gemm (the blocks
``uniform_selects`` found unmasked in TileLang's attention examples, the op's causal
``T.clear``), the gemm overwrites it instead (wgmma ``use_acc`` chosen at run time), as
``tilews.ops.attention``'s non-causal program does with ``clear_accum``. Compile-only on Hopper
(lowered IR and emitted Gluon), the lowered programs on the interpreter against a float64
reference (a ragged last key block, so both sides of the branch run)."""
import dataclasses
import re

import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import runtime_clear
from tilews.lowering.pipeline import lower
from tilews.lowering.traverse import walk
from tilews.ops.attention import mha_fwd_program
from tilews.triton_ext.gluon import emit
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import poisoned, randn
from .test_longest_first import GPU_BLOCKS, reference, user_program


# the masks TileLang's examples write before the gemm are moved after it on Hopper
# (mask_after_gemm, tests/test_mask_after_gemm.py); this pass takes them where that one is off
# and the op's explicit branches
HOPPER_MASK_BEFORE = dataclasses.replace(HOPPER, pipeline=HOPPER.pipeline.without("mask_after_gemm"))


def score_gemms(kernel: ir.Kernel) -> list:
    """The Q K^T gemms (the ones writing a scores tile ``acc_s*``)."""
    return [s for s in walk(kernel.body) if isinstance(s, ir.Gemm) and s.c.buffer.name.startswith("acc_s")]


@pytest.mark.parametrize("causal", [False, True])
def test_user_program_overwrites_its_scores(causal):
    lowered = lower(user_program(8, 16, 4096, 64, causal, **GPU_BLOCKS),
                    HOPPER_MASK_BEFORE.replace(num_sms=132))
    assert any(n.startswith("runtime_clear: the T.gemm at line") for n in lowered.notes), lowered.notes
    gemms = score_gemms(lowered)
    # both consumer warp groups, the peeled first block and the loop's: none accumulates
    # into zeros moved into its registers
    assert len(gemms) == 4 and all(g.may_clear for g in gemms), gemms
    assert any(g.clear_if is not None for g in gemms)
    source = emit(lowered)
    runtime = re.findall(r"acc_s_\d = warpgroup_mma\(.*use_acc=(?!False)", source)
    assert len(runtime) >= 2, source
    # the unmasked branch moves no zeros into the scores any more
    assert not re.search(r"acc_s_\d = gl\.full\(\[64, 128\], 0\.0", source)


def test_op_causal_clear_becomes_runtime_choice_and_non_causal_stays():
    causal = lower(build_kernel(mha_fwd_program(8, 16, 4096, 64, True, layout="bshd")),
                   HOPPER_MASK_BEFORE.replace(num_sms=132))
    assert all(g.clear_if is not None for g in score_gemms(causal) if not g.clear_accum)
    assert any(n.startswith("runtime_clear:") for n in causal.notes)
    full = build_kernel(mha_fwd_program(8, 16, 4096, 64, False, layout="bshd"))
    assert runtime_clear.run(full, HOPPER) is full           # already clear_accum


def test_a_fill_the_gemm_does_not_directly_follow_stays():
    """Something between the zero fill and the gemm (here a read of the zeroed tile) keeps the
    fill: the gemm must see what the branch left."""

    @T.prim_func
    def main(A: T.Tensor((64, 64), T.float16), B: T.Tensor((64, 64), T.float16),
             n: T.int32, C: T.Tensor((64, 64), T.float32), D: T.Tensor((64, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_shared([64, 64], T.float16)
            b = T.alloc_shared([64, 64], T.float16)
            c = T.alloc_fragment([64, 64], T.float32)
            T.copy(A, a)
            T.copy(B, b)
            if n > 0:
                T.clear(c)
            else:
                T.fill(c, 1)
            T.copy(c, D)
            T.gemm(a, b, c)
            T.copy(c, C)

    kernel = build_kernel(main)
    assert runtime_clear.run(kernel, HOPPER) is kernel


@pytest.mark.parametrize("causal", [False, True])
def test_lowered_hopper_program_matches_reference(causal):
    """200 keys in 64-row blocks: the last key block is ragged (masked), the others overwrite."""
    seq = 200
    kernel = user_program(1, 2, seq, 64, causal, block_M=64, block_N=64, num_stages=2, threads=128)
    lowered = lower(kernel, HOPPER_MASK_BEFORE.replace(num_sms=3))
    assert any(n.startswith("runtime_clear:") for n in lowered.notes), lowered.notes
    q, k, v = (randn(1, seq, 2, 64, dtype=torch.float16, seed=20 + i) for i in range(3))
    out = poisoned(1, seq, 2, 64, dtype=torch.float16)
    interpreter.run(lowered, [q, k, v, out], seed=int(causal))
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), atol=2e-3, rtol=2e-3)
