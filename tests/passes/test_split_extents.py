"""split_extents: on-chip tiles whose extents are not powers of two become power-of-two pieces.

Goldens of the pass's output on small programs; the interpreter as oracle (the program before
the pass, after it, and after the whole Hopper pipeline give the same result on random inputs,
checked against torch too) for a GEMM with a 192-wide tile, one with block_K 96, and attention
at head dims 96 and 192, causal and not; and the programs the pass leaves whole, with the note
that says why.
"""
from __future__ import annotations

import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir, printer
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import split_extents
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, AsyncRefusal, LayoutPlan
from tilews.lowering.traverse import walk
from tilews.ops.attention import mha_fwd_program
from tilews.triton_ext.gluon.backend import HOPPER

from examples.gemm import matmul

from ..helpers import marked_line, poisoned, rel_err, randn


# ----------------------------------------------------------------------------------------------
# programs, as a TileLang user writes them (the GEMM and attention are the repo's own copies of
# TileLang's examples)


def gemm(M, N, K, block_M=128, block_N=192, block_K=64, stages=3):
    """examples/gemm.py's program (TileLang's quickstart GEMM) in float16."""
    return matmul.fn(M, N, K, block_M=block_M, block_N=block_N, block_K=block_K, num_stages=stages)


def attention(batch, heads, seq_len, dim, is_causal, block_M=128, block_N=64, stages=2, threads=256):
    """tilews.ops.attention's program (TileLang's example_mha_fwd_bhsd) in float16."""
    return mha_fwd_program(batch, heads, seq_len, dim, is_causal, block_M=block_M, block_N=block_N,
                           num_stages=stages, threads=threads)


def row_stats(rows, cols, kind):
    """Y[r] = reduce over a [rows, cols] tile (cols not a power of two), plus 1, plus X[r, 0] and
    X[r, cols - 1] read at constant indices of the cut tile."""
    reduce = {"max": T.reduce_max, "sum": T.reduce_sum, "abssum": T.reduce_abssum,
              "absmax": T.reduce_absmax}[kind]

    @T.prim_func
    def main(X: T.Tensor((rows, cols), T.float32), Y: T.Tensor((rows,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((rows, cols), T.float32)
            r = T.alloc_fragment((rows,), T.float32)
            T.copy(X[0, 0], x)
            for i, j in T.Parallel(rows, cols):
                x[i, j] = x[i, j] * 2.0
            reduce(x, r, dim=1)
            for i in T.Parallel(rows):
                r[i] = r[i] + 1.0 + x[i, 0] + x[i, cols - 1]
            T.copy(r, Y[0])
    return main


def prefix_sums(rows, cols):
    @T.prim_func
    def main(X: T.Tensor((rows, cols), T.float32), Y: T.Tensor((rows, cols), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((rows, cols), T.float32)
            T.copy(X[0, 0], x)
            T.cumsum(x, dim=1)  # <- kept whole
            T.copy(x, Y[0, 0])
    return main


def split_k_gemm(M, N, K, splits, block_K=64, col0=16):
    """Y[:, col0:col0 + N] += A @ B, each of ``splits`` blocks adding its share of K's product
    as dQ's tile in the attention backward: the float32 accumulator (N not a power of two)
    through a shared tile, added by one tile atomic (on Hopper a bulk reduce-add)."""
    steps = K // splits // block_K

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             Y: T.Tensor((M, col0 + N), T.float32)):
        with T.Kernel(splits, threads=128) as bx:
            A_s = T.alloc_shared((M, block_K), T.float16)
            B_s = T.alloc_shared((block_K, N), T.float16)
            c = T.alloc_fragment((M, N), T.float32)
            c_s = T.alloc_shared((M, N), T.float32)
            T.clear(c)
            for k in T.Pipelined(steps, num_stages=2):
                T.copy(A[0, (bx * steps + k) * block_K], A_s)
                T.copy(B[(bx * steps + k) * block_K, 0], B_s)
                T.gemm(A_s, B_s, c)
            T.copy(c, c_s)
            T.atomic_add(Y[0, col0], c_s)
    return main


def split(prim) -> ir.Kernel:
    return split_extents.run(build_kernel(prim), HOPPER)


def interp(kernel: ir.Kernel, args: list, out: int) -> torch.Tensor:
    args = list(args)
    args[out] = poisoned(*args[out].shape, dtype=args[out].dtype)
    interpreter.run(kernel, args)
    return args[out]


# ----------------------------------------------------------------------------------------------
# goldens


def test_gemm_192_wide_tile(expect):
    expect(printer.to_text(split(gemm(256, 384, 128))))


def test_gemm_block_k_96(expect):
    expect(printer.to_text(split(gemm(256, 256, 192, block_N=128, block_K=96))))


def test_attention_head_dim_192(expect):
    expect(printer.to_text(split(attention(1, 1, 128, 192, True))))


@pytest.mark.parametrize("kind", ["max", "abssum"])
def test_reduction_along_the_cut_dim(expect, kind):
    expect(printer.to_text(split(row_stats(16, 48, kind))))


def test_tile_atomic_of_a_cut_tile(expect):
    expect(printer.to_text(split(split_k_gemm(64, 96, 256, 2))))


def test_cumsum_along_the_cut_dim_is_kept_whole():
    prim = prefix_sums(16, 48)
    k = build_kernel(prim)
    after = split_extents.run(k, HOPPER)
    assert after.body == k.body
    line = marked_line(prefix_sums, "# <- kept whole")
    assert after.notes[-1] == f"split_extents: kept whole, the cumulative sum at line {line} runs along a cut dim"


def test_power_of_two_programs_are_unchanged():
    k = build_kernel(gemm(256, 256, 128, block_N=128))
    assert split_extents.run(k, HOPPER) is k


def test_rows_split_consumers_divide_are_kept_whole():
    # block_M 192 with three consumer warp groups: split_consumers gives each 64 rows
    k = split(attention(1, 1, 384, 64, False, block_M=192, threads=384))
    assert [n for n in k.notes if n.startswith("split_extents")] == [
        "split_extents: kept whole, dim 0 of 'Q_shared' (192) is a gemm's M dim: rows are not "
        "cut (split_consumers divides them among warp groups)"]
    assert lower(build_kernel(attention(1, 1, 384, 64, False, block_M=192, threads=384)),
                 HOPPER).find_plan(AsyncPlan) is not None


def test_a_piece_smaller_than_a_wgmma_keeps_the_program_whole():
    # head dim 40 = 32 + 8: a K piece of 8 is below wgmma's k step 16, so the program stays
    # whole and legalize_wgmma says why (the tl backend takes it)
    prim = attention(1, 1, 64, 40, False, block_M=64, block_N=64, threads=128)
    k = split(prim)
    assert any("would be smaller than a wgmma instruction" in n for n in k.notes), k.notes
    refusal = lower(build_kernel(prim), HOPPER).find_plan(AsyncRefusal)
    assert refusal is not None and "is 40, not a multiple of wgmma's k step 16" in refusal.reason


# ----------------------------------------------------------------------------------------------
# the interpreter as oracle


def check_oracle(prim, args, out, want, tol):
    before = build_kernel(prim)
    got_before = interp(before, args, out)
    got_split = interp(split_extents.run(before, HOPPER), args, out)
    lowered = lower(before, HOPPER)
    assert lowered.find_plan(AsyncPlan) is not None, lowered.plans
    assert any(isinstance(s, ir.WarpSpecialize) for s in walk(lowered.body))
    got_lowered = interp(lowered, args, out)
    for got in (got_before, got_split, got_lowered):
        assert rel_err(got.float(), want) < tol
    # cutting only reorders float sums: the three agree far more closely than with torch
    assert rel_err(got_split.float(), got_before.float()) < 1e-3
    assert rel_err(got_lowered.float(), got_split.float()) < 1e-3


@pytest.mark.parametrize("block_N,block_K", [(192, 64), (128, 96)])
def test_gemm_oracle(block_N, block_K):
    M, N, K = 256, 2 * block_N, 3 * block_K
    a, b = randn(M, K, dtype=torch.float16, seed=1), randn(K, N, dtype=torch.float16, seed=2)
    want = a.float() @ b.float()
    check_oracle(gemm(M, N, K, block_N=block_N, block_K=block_K), [a, b, torch.empty(M, N, dtype=torch.float16)],
                 2, want, 2e-3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [96, 192])
def test_attention_oracle(dim, causal):
    B, H, S = 1, 2, 192
    q, k, v = (randn(B, H, S, dim, dtype=torch.float16, seed=s) for s in (3, 4, 5))
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            is_causal=causal)
    check_oracle(attention(B, H, S, dim, causal), [q, k, v, torch.empty(B, H, S, dim, dtype=torch.float16)],
                 3, want, 5e-3)


@pytest.mark.parametrize("kind", ["max", "sum", "abssum", "absmax"])
def test_reduction_oracle(kind):
    x = randn(16, 48, seed=6)
    y = 2 * x
    r = {"max": y.amax(1), "sum": y.sum(1), "abssum": y.abs().sum(1), "absmax": y.abs().amax(1)}[kind]
    want = r + 1 + y[:, 0] + y[:, -1]
    before = build_kernel(row_stats(16, 48, kind))
    after = split_extents.run(before, HOPPER)
    assert after is not before and any(isinstance(s, ir.Reduce) and not s.clear for s in walk(after.body))
    for k in (before, after):
        assert rel_err(interp(k, [x, torch.empty(16)], 1), want) < 1e-6


def test_loop_pieces_have_variables_of_their_own():
    # infer_layouts keys a T.Parallel's layout by its first variable's name: a piece sharing
    # the first piece's names ran in that piece's layout (D96's 32 columns in the 64 columns'
    # layout, each element twice in a thread's registers)
    k = split(attention(1, 1, 128, 96, False))
    loops = [s for s in walk(k.body) if isinstance(s, ir.Parallel)]
    assert len(loops) > len({s.loc for s in loops})                  # some loops were cut
    assert len({s.vars[0].name for s in loops}) == len(loops)
    lowered = lower(build_kernel(attention(1, 1, 128, 96, False)), HOPPER)
    frames = dict(lowered.find_plan(LayoutPlan).frames)
    layouts = dict(lowered.find_plan(LayoutPlan).layouts)
    for s in (s for s in walk(lowered.body) if isinstance(s, ir.Parallel)):
        for b in {x.buffer for x in walk(s.body) if isinstance(x, ir.Store)}:
            if b.scope is ir.Scope.FRAGMENT and len(b.shape) == 2:
                assert frames[s.vars[0].name] == layouts[b.name], (s.vars[0].name, b.name)


def two_scalings(rows, cols):
    """Two loops over a [rows, cols] tile, the second's variables named as split_extents names
    the first's second piece (``i_1``, ``j_1``)."""
    @T.prim_func
    def main(X: T.Tensor((rows, cols), T.float32), Y: T.Tensor((rows, cols), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((rows, cols), T.float32)
            T.copy(X[0, 0], x)
            for i, j in T.Parallel(rows, cols):
                x[i, j] = x[i, j] * 2.0
            for i_1, j_1 in T.Parallel(rows, cols):
                x[i_1, j_1] = x[i_1, j_1] + 1.0
            T.copy(x, Y[0, 0])
    return main


def test_loop_pieces_never_share_a_made_name():
    # the first loop's second piece takes i_1_1 (i_1 is the user's); the second loop's second
    # piece would have been named i_1_1 too, and run in the first's layout
    k = split(two_scalings(16, 48))
    loops = [s for s in walk(k.body) if isinstance(s, ir.Parallel)]
    assert len(loops) == 4
    names = [v.name for s in loops for v in s.vars]
    assert len(set(names)) == len(names), names
    x = randn(16, 48, seed=7)
    assert rel_err(interp(k, [x, torch.empty(16, 48)], 1), 2 * x + 1) < 1e-6


@pytest.mark.parametrize("N", [96, 192])
def test_tile_atomic_oracle(N):
    # one tile atomic per piece, each into Y's columns shifted by the piece's offset; on Hopper
    # each a bulk reduce-add of its own shared piece
    M, K, splits, col0 = 64, 512, 4, 16
    a, b = randn(M, K, dtype=torch.float16, seed=8), randn(K, N, dtype=torch.float16, seed=9)
    y0 = randn(M, col0 + N, seed=10)
    want = y0.double().clone()
    want[:, col0:] += a.double() @ b.double()
    pieces = [1 << n for n in reversed(range(N.bit_length())) if N >> n & 1]
    before = build_kernel(split_k_gemm(M, N, K, splits, col0=col0))
    after = split_extents.run(before, HOPPER)
    adds = [s for s in walk(after.body) if isinstance(s, ir.AtomicAdd)]
    assert [a.value.buffer.static_shape[1] for a in adds] == [a.dst.extents[1] for a in adds] == pieces
    assert [ir.as_int(a.dst.starts[1]) for a in adds] == [col0 + sum(pieces[:n]) for n in range(len(pieces))]
    lowered = lower(before, HOPPER)
    assert lowered.find_plan(AsyncPlan) is not None, lowered.plans
    assert any(isinstance(s, ir.WarpSpecialize) for s in walk(lowered.body))
    assert len([s for s in walk(lowered.body) if isinstance(s, ir.AtomicAdd)
                and s.value.buffer.scope is ir.Scope.SHARED]) == len(pieces)
    got = []
    for k in (before, after, lowered):
        y = y0.clone()
        interpreter.run(k, [a, b, y])
        assert rel_err(y.double(), want) < 1e-5
        got.append(y)
    # cutting only reorders float sums
    assert (got[1] - got[0]).abs().max() < 1e-3 and (got[2] - got[1]).abs().max() < 1e-3
