"""``mask_after_gemm`` and the P cast ``overlap_softmax`` places next to the P V wgmma: a
TileLang-style attention program whose scores start at ``T.if_then_else(mask, 0, -inf)`` before
``S += Q K^T`` gets ``S = Q K^T`` and the mask applied after, and the cast of block k's P runs at
the top of the next iteration, right before the P V wgmma reads it (no branch between: ptxas
packs P as it converts it). Compile-only on Hopper (lowered IR, emitted Gluon), the lowered
program on the interpreter against a float64 reference, ragged so that masked, unmasked and
partly masked key blocks all run."""
import re

import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import mask_after_gemm
from tilews.lowering.pipeline import lower
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon import emit
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import poisoned, randn
from .test_longest_first import reference


def attention(batch, heads, seq, dim, causal, block_M, block_N, threads):
    """Flash attention in TileLang's form: BSHD tensors, the scores started at 0 / -inf and
    accumulated into, online softmax in base 2."""
    scale = 1.44269504 / dim ** 0.5
    shape = [batch, seq, heads, dim]

    @T.prim_func
    def main(Q: T.Tensor(shape, T.float16), K: T.Tensor(shape, T.float16),
             V: T.Tensor(shape, T.float16), Out: T.Tensor(shape, T.float16)):
        with T.Kernel(T.ceildiv(seq, block_M), heads, batch, threads=threads) as (bx, by, bz):
            q = T.alloc_shared([block_M, dim], T.float16)
            k_tile = T.alloc_shared([block_N, dim], T.float16)
            v_tile = T.alloc_shared([block_N, dim], T.float16)
            s = T.alloc_fragment([block_M, block_N], T.float32)
            p = T.alloc_fragment([block_M, block_N], T.float16)
            o = T.alloc_fragment([block_M, dim], T.float32)
            row_max = T.alloc_fragment([block_M], T.float32)
            prev_max = T.alloc_fragment([block_M], T.float32)
            rescale = T.alloc_fragment([block_M], T.float32)
            row_sum = T.alloc_fragment([block_M], T.float32)
            total = T.alloc_fragment([block_M], T.float32)
            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], q)
            T.fill(o, 0)
            T.fill(total, 0)
            T.fill(row_max, -T.infinity(T.float32))
            blocks = T.ceildiv(seq, block_N)
            if causal:
                blocks = T.min(blocks, T.ceildiv((bx + 1) * block_M, block_N))
            for kb in T.Pipelined(blocks, num_stages=2):
                T.copy(K[bz, kb * block_N:(kb + 1) * block_N, by, :], k_tile)
                for i, j in T.Parallel(block_M, block_N):
                    if causal:
                        s[i, j] = T.if_then_else(bx * block_M + i >= kb * block_N + j, 0,
                                                 -T.infinity(T.float32))
                    else:
                        s[i, j] = T.if_then_else(kb * block_N + j >= seq, -T.infinity(T.float32), 0)
                T.gemm(q, k_tile, s, transpose_B=True)
                T.copy(row_max, prev_max)
                T.reduce_max(s, row_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    rescale[i] = T.exp2(prev_max[i] * scale - row_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    s[i, j] = T.exp2(s[i, j] * scale - row_max[i] * scale)
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_M):
                    total[i] = total[i] * rescale[i] + row_sum[i]
                T.copy(s, p)
                for i, j in T.Parallel(block_M, dim):
                    o[i, j] *= rescale[i]
                T.copy(V[bz, kb * block_N:(kb + 1) * block_N, by, :], v_tile)
                T.gemm(p, v_tile, o)
            for i, j in T.Parallel(block_M, dim):
                o[i, j] /= total[i]
            T.copy(o, Out[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return main


def score_gemms(kernel: ir.Kernel) -> list:
    return [s for s in walk(kernel.body) if isinstance(s, ir.Gemm) and s.c.buffer.name.startswith("s")]


@pytest.mark.parametrize("dim", [64, 128])
def test_causal_scores_are_overwritten_and_masked_after(dim):
    lowered = lower(build_kernel(attention(8, 16, 4096, dim, True, 128, 128, 256)),
                    HOPPER.replace(num_sms=132))
    assert any(n.startswith("mask_after_gemm: the T.gemm at line") for n in lowered.notes), lowered.notes
    assert not any(n.startswith("runtime_clear:") for n in lowered.notes), lowered.notes
    gemms = score_gemms(lowered)
    # two consumer warp groups, the peeled first block and the loop's
    assert len(gemms) == 4 and all(g.clear_accum and g.clear_if is None for g in gemms), gemms
    source = emit(lowered)
    for role in re.split(r"\n@gluon\.jit\n", source):
        steady = re.search(r"\n( +)for kb in range\(.*\n((?:\1 .*\n)+)", role)
        if steady is None or "warpgroup_mma(p_" not in steady.group(2):
            continue
        # comments and the loop's invariant integers named at its top (t_<n> = ...) aside,
        body = [line.strip() for line in steady.group(2).splitlines()
                if not line.strip().startswith("#") and not re.match(r"t_\d+ = ", line.strip())]
        # the previous block's P is cast first, before the branch of this block's mask and
        # the wgmmas; the mask follows the scores' wgmma
        assert re.match(r"p_\d = gl\.convert_layout\(s_\d\.to\(gl\.float16\)", body[0]), body[:3]
        first_if = next(n for n, line in enumerate(body) if line.startswith("if "))
        first_mma = next(n for n, line in enumerate(body) if "warpgroup_mma(" in line)
        assert first_mma < first_if, body
        assert not any("use_acc=" in line and "use_acc=False" not in line for line in body), body
        break
    else:
        raise AssertionError(f"no steady loop with a P V wgmma in:\n{source}")


@pytest.mark.parametrize("causal", [False, True])
def test_lowered_hopper_program_matches_reference(causal):
    """200 keys in 64-row blocks: the non-causal program's last key block is ragged; the causal
    one has blocks below, on and (past the end) beyond the diagonal."""
    seq = 200
    lowered = lower(build_kernel(attention(1, 2, seq, 64, causal, 64, 64, 128)), HOPPER.replace(num_sms=3))
    assert any(n.startswith("mask_after_gemm:") for n in lowered.notes), lowered.notes
    assert any(n.startswith("overlap_softmax: in the loop") for n in lowered.notes), lowered.notes
    q, k, v = (randn(1, seq, 2, 64, dtype=torch.float16, seed=30 + i) for i in range(3))
    out = poisoned(1, seq, 2, 64, dtype=torch.float16)
    interpreter.run(lowered, [q, k, v, out], seed=int(causal))
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), atol=2e-3, rtol=2e-3)


def test_masks_that_are_not_absorbed_stay():
    """A start other than 0 / +-inf (1 + sum is no sum's rounding), or one reading the
    accumulator, is left before the gemm."""

    def program(start):
        @T.prim_func
        def main(A: T.Tensor((64, 64), T.float16), B: T.Tensor((64, 64), T.float16),
                 C: T.Tensor((64, 64), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared([64, 64], T.float16)
                b = T.alloc_shared([64, 64], T.float16)
                c = T.alloc_fragment([64, 64], T.float32)
                T.copy(A, a)
                T.copy(B, b)
                T.fill(c, 2)
                for i, j in T.Parallel(64, 64):
                    c[i, j] = start(i, j, c)
                T.gemm(a, b, c)
                T.copy(c, C)
        return build_kernel(main)

    for start in (lambda i, j, c: T.if_then_else(i >= j, 1.0, -T.infinity(T.float32)),
                  lambda i, j, c: T.if_then_else(c[i, j] > 1, 0, -T.infinity(T.float32))):
        kernel = program(start)
        assert mask_after_gemm.run(kernel, HOPPER) is kernel
    moved = mask_after_gemm.run(program(lambda i, j, c: T.if_then_else(i >= j, 0, T.infinity(T.float32))),
                                HOPPER)
    assert [g.clear_accum for g in walk(moved.body) if isinstance(g, ir.Gemm)] == [True]
