"""Partial and element access to on-chip buffers (issue 38, item 2) on every CPU target.

Slices of fragments and shared buffers as copy sources and destinations (``acc[:valid, :]`` at a
static or runtime start, a column ``S[:, k]`` at a runtime ``k``), element stores inside
``T.Parallel`` at indices that are not the loop's variables (under an ``if``, a broadcast scalar, a
loop of another extent, ``buf[i // 2, j]``) and reads at computed indices (packed-int
dequantization, ``B[i, j // 2]``). Each runs on ``interpret``, ``triton`` (Triton's CPU
interpreter; the ``tl`` emitter gathers and scatters through ``tl.gather``) and ``metal`` (the CPU
harness) against a torch reference, outputs poisoned; on ``hopper`` the programs compile through
the ``tl`` fallback.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import randn
from .test_odd_extents import compile_for_sm90

TARGETS = ["interpret", "triton", "metal"]


def build(program, target, out_idx=-1):
    return tilews.jit(out_idx=out_idx, target=target)(program)


def partial_rows(heads, block_H, valid, dim):
    """O[rows of this block] = 2 * Q[...]: the first ``valid`` rows of a [block_H, dim] fragment
    copied out through a [valid, dim] shared tile (GQA decoding with few valid heads)."""
    @T.prim_func
    def main(Q: T.Tensor((heads, dim), T.float32), O: T.Tensor((heads, dim), T.float32)):
        with T.Kernel(heads // valid, threads=128) as hid:
            acc = T.alloc_fragment((block_H, dim), T.float32)
            O_s = T.alloc_shared((valid, dim), T.float32)
            T.copy(Q[hid * valid:hid * valid + block_H, :], acc)
            for i, j in T.Parallel(block_H, dim):
                acc[i, j] = acc[i, j] * 2.0
            T.copy(acc[:valid, :], O_s)
            T.copy(O_s, O[hid * valid:(hid + 1) * valid, :])
    return main


def rows_at_runtime_starts(n_blocks, block_H, rows, dim):
    """O[b] = X[b][start[b] : start[b] + rows] * 3, then written back into rows starting at
    ``start[b]`` of a zeroed fragment: ranges of on-chip buffers at runtime starts, read and
    written."""
    @T.prim_func
    def main(X: T.Tensor((n_blocks, block_H, dim), T.float32), start: T.Tensor((n_blocks,), T.int32),
             O: T.Tensor((n_blocks, rows, dim), T.float32), P: T.Tensor((n_blocks, block_H, dim), T.float32)):
        with T.Kernel(n_blocks, threads=128) as b:
            x = T.alloc_fragment((block_H, dim), T.float32)
            part = T.alloc_shared((rows, dim), T.float32)
            back = T.alloc_fragment((block_H, dim), T.float32)
            s = start[b]
            T.copy(X[b, :, :], x)
            T.copy(x[s:s + rows, :], part)
            for i, j in T.Parallel(rows, dim):
                part[i, j] = part[i, j] * 3.0
            T.copy(part, O[b, :, :])
            T.clear(back)
            T.copy(part, back[s:s + rows, :])
            T.copy(back, P[b, :, :])
    return main


def column_writes(block_H, n_cols, dim):
    """S[:, k] = row maxima of X's k-th [block_H, dim] slab, for k in 0..n_cols (a column of a
    shared tile at a runtime index, from a [block_H] fragment); then each column read back."""
    @T.prim_func
    def main(X: T.Tensor((n_cols, block_H, dim), T.float32), S: T.Tensor((block_H, n_cols), T.float32),
             R: T.Tensor((n_cols, block_H), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((block_H, dim), T.float32)
            m = T.alloc_fragment((block_H,), T.float32)
            S_s = T.alloc_shared((block_H, n_cols), T.float32)
            T.clear(S_s)
            for k in T.serial(n_cols):
                T.copy(X[k, :, :], x)
                T.reduce_max(x, m, dim=1)
                T.copy(m, S_s[:, k])
            T.copy(S_s, S[0, 0])
            for k in T.serial(n_cols):
                T.copy(S_s[:, k], m)
                T.copy(m, R[k, :])
    return main


def guarded_element_stores(heads, block_H, valid):
    """sinks[i] = Sinks[by] for the valid rows only (an `if` over a broadcast scalar), then
    a [2 * block_H] buffer written over a loop of block_H at 2 * i and 2 * i + 1, and a
    [block_H // 2, 8] buffer at (i // 2, j) by the odd rows (rows 2r and 2r + 1 both storing
    to half[r] would be a race)."""
    @T.prim_func
    def main(Sinks: T.Tensor((heads,), T.float32), X: T.Tensor((block_H, 8), T.float32),
             A: T.Tensor((heads, block_H), T.float32), B: T.Tensor((heads, 2 * block_H), T.float32),
             C: T.Tensor((heads, block_H // 2, 8), T.float32)):
        with T.Kernel(heads, threads=128) as by:
            sinks = T.alloc_fragment((block_H,), T.float32)
            wide = T.alloc_fragment((2 * block_H,), T.float32)
            half = T.alloc_fragment((block_H // 2, 8), T.float32)
            T.fill(sinks, -1.0)
            for i in T.Parallel(block_H):
                if i < valid:
                    sinks[i] = Sinks[by]
            for i in T.Parallel(block_H):
                wide[2 * i] = sinks[i]
                wide[2 * i + 1] = i * 1.0
            for i, j in T.Parallel(block_H, 8):
                if i % 2 == 1:
                    half[i // 2, j] = X[i, j] + by
            T.copy(sinks, A[by, :])
            T.copy(wide, B[by, :])
            T.copy(half, C[by, :, :])
    return main


def dequant_gemm(M, N, K, block_M, block_N, block_K):
    """C = A @ dequant(B)^T where B packs two signed 4-bit values per byte (low nibble first):
    the unpacking reads the packed fragment at (i, j // 2) (TileLang's w4a8 example)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((N, K // 2), T.uint8),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), T.float16)
            B_s = T.alloc_shared((block_N, block_K // 2), T.uint8)
            B_local = T.alloc_fragment((block_N, block_K // 2), T.uint8)
            B_deq = T.alloc_fragment((block_N, block_K), T.float16)
            acc = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=1):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[bx * block_N, k * block_K // 2], B_s)
                T.copy(B_s, B_local)
                for i, j in T.Parallel(block_N, block_K):
                    nib = (B_local[i, j // 2] >> ((j % 2) * 4).astype(T.uint8)) & T.uint8(15)
                    B_deq[i, j] = (nib.astype(T.int8) - T.int8(8)).astype(T.float16)
                T.gemm(A_s, B_deq, acc, transpose_B=True)
            T.copy(acc, C[by * block_M, bx * block_N])
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("block_H,valid,dim", [(8, 3, 16), (16, 4, 24)])
def test_partial_rows_of_a_fragment(target, block_H, valid, dim):
    heads = 4 * valid
    q = randn(heads + block_H, dim, seed=1)[:heads].contiguous()
    o = build(partial_rows(heads, block_H, valid, dim), target)(q)
    assert torch.equal(o, q * 2)


@pytest.mark.parametrize("target", TARGETS)
def test_rows_at_runtime_starts(target):
    nb, bh, rows, dim = 3, 8, 4, 16
    x = randn(nb, bh, dim, seed=2)
    start = torch.tensor([0, 3, 4], dtype=torch.int32)
    o, p = build(rows_at_runtime_starts(nb, bh, rows, dim), target, out_idx=[2, 3])(x, start)
    want_p = torch.zeros_like(x)
    for b, s in enumerate(start.tolist()):
        assert torch.equal(o[b], x[b, s:s + rows] * 3)
        want_p[b, s:s + rows] = x[b, s:s + rows] * 3
    assert torch.equal(p, want_p)


@pytest.mark.parametrize("target", TARGETS)
def test_column_writes_at_a_runtime_index(target):
    bh, n, dim = 8, 5, 16
    x = randn(n, bh, dim, seed=3)
    s, r = build(column_writes(bh, n, dim), target, out_idx=[1, 2])(x)
    assert torch.equal(s, x.amax(dim=2).T)
    assert torch.equal(r, x.amax(dim=2))


@pytest.mark.parametrize("target", TARGETS)
def test_element_stores_at_computed_indices(target):
    heads, bh, valid = 3, 8, 5
    sink, x = randn(heads, seed=4), randn(bh, 8, seed=5)
    a, b, c = build(guarded_element_stores(heads, bh, valid), target, out_idx=[2, 3, 4])(sink, x)
    want_a = torch.full((heads, bh), -1.0)
    want_a[:, :valid] = sink[:, None]
    assert torch.equal(a, want_a)
    want_b = torch.stack([want_a, torch.arange(bh).float().expand(heads, bh)], dim=2).reshape(heads, 2 * bh)
    assert torch.equal(b, want_b)
    for h in range(heads):      # row 2r + 1 stores to half[r]
        assert torch.equal(c[h], x[1::2] + h)


def unpack_int4(b):
    lo, hi = (b & 0xF).to(torch.int8) - 8, (b >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=-1).reshape(b.shape[0], -1)


@pytest.mark.parametrize("target", TARGETS)
def test_packed_int4_dequantization(target):
    M, N, K = 48, 40, 96
    a = randn(M, K, dtype=torch.float16, seed=6)
    g = torch.Generator().manual_seed(7)
    b = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    c = build(dequant_gemm(M, N, K, 16, 32, 32), target)(a, b)
    ref = a.double() @ unpack_int4(b).double().T
    assert torch.allclose(c.double(), ref, atol=1e-2, rtol=1e-3), (c.double() - ref).abs().max()


HOPPER_CASES = {
    "partial_rows": lambda: partial_rows(64, 16, 4, 128),
    "rows_at_runtime_starts": lambda: rows_at_runtime_starts(4, 16, 4, 64),
    "column_writes": lambda: column_writes(16, 5, 64),
    "element_stores": lambda: guarded_element_stores(4, 16, 5),
    "dequant_gemm": lambda: dequant_gemm(256, 256, 256, 64, 64, 64),
}


@pytest.mark.parametrize("name", sorted(HOPPER_CASES))
def test_hopper_falls_to_tl_and_compiles(name):
    k = build(HOPPER_CASES[name](), "hopper", out_idx=None)
    assert k.report.target == "hopper -> triton" and k.report.backend == "tl", k.report.notes
    compile_for_sm90(__name__, "HOPPER_CASES", name)


def one_element_out(n, at):
    """B[0] = 3 * A[at]: a one-element slice of a fragment copied to global memory (every dim
    picked: the ``tl`` emitter's value is a scalar there)."""
    @T.prim_func
    def main(A: T.Tensor((n,), T.float32), B: T.Tensor((1,), T.float32)):
        with T.Kernel(1, threads=128) as _:
            frag = T.alloc_fragment((n,), T.float32)
            T.copy(A[0:n], frag)
            for i in T.Parallel(n):
                frag[i] = frag[i] * 3.0
            T.copy(frag[at:at + 1], B[0:1])
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("at", [0, 5])
def test_one_element_of_a_fragment_to_global(target, at):
    a = randn(32, seed=4)
    b = build(one_element_out(32, at), target)(a)
    assert torch.equal(b, a[at:at + 1] * 3)
