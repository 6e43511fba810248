"""swizzle_grid: T.use_swizzle's panel order is one linear grid, decided in lowering."""
import pytest
import torch

import tilews.language as T
from tilews.lowering import ir, printer
from tilews.lowering.frontend import build_kernel
from tilews.lowering.interpreter import run
from tilews.lowering.passes import lower
from tilews.lowering.simplify import evaluate
from tilews.lowering.target import INTERPRET
from tilews.lowering.traverse import walk

from ..helpers import poisoned, randn

B = 16   # every block edge


def tile_copy(M, N, panel):
    """Y = X, one 16 x 16 tile per block of a (ceil(N / 16), ceil(M / 16)) grid."""
    @T.prim_func
    def main(X, Y):
        with T.Kernel(T.ceildiv(N, B), T.ceildiv(M, B), threads=128) as (bx, by):
            T.use_swizzle(panel)
            t = T.alloc_fragment((B, B), T.float32)
            T.copy(X[by * B, bx * B], t)
            T.copy(t, Y[by * B, bx * B])
    spec = T.Tensor((M, N), T.float32)
    return build_kernel(main, {"X": spec, "Y": spec})


def gemm(M, N, K, panel, m=None):
    """C = A @ B; ``m`` (T.dynamic) makes the row count, and so the grid, a runtime value."""
    @T.prim_func
    def main(A, B_, C):
        with T.Kernel(T.ceildiv(C.shape[1], B), T.ceildiv(C.shape[0], B), threads=128) as (bx, by):
            if panel:
                T.use_swizzle(panel)
            A_s = T.alloc_shared((B, B), T.float32)
            B_s = T.alloc_shared((B, B), T.float32)
            C_f = T.alloc_fragment((B, B), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, B), num_stages=2):
                T.copy(A[by * B, k * B], A_s)
                T.copy(B_[k * B, bx * B], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * B, bx * B])
    rows = M if m is None else m
    specs = {"A": T.Tensor((rows, K), T.float32), "B_": T.Tensor((K, N), T.float32),
             "C": T.Tensor((rows, N), T.float32)}
    return build_kernel(main, specs)


def swizzled(kernel):
    return lower(kernel, INTERPRET, upto="swizzle_grid")


def test_tile_copy(expect):
    expect(printer.to_text(swizzled(tile_copy(80, 48, panel=2))))


def test_blocks_visit_panels_of_rows():
    """5 rows of 3 tiles in panels of 2 rows (the last panel has one): block i stores tile
    (by, bx) = ORDER[i]."""
    kernel = swizzled(tile_copy(80, 48, panel=2))
    assert kernel.swizzle_panel == 0 and [ir.as_int(g) for g in kernel.grid] == [15]
    store = [s for s in walk(kernel.body) if isinstance(s, ir.Copy) and s.dst.buffer.name == "Y"]
    block, = kernel.block_vars
    order = [tuple(evaluate(st, {block: i}) // B for st in store[0].dst.starts) for i in range(15)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                     (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
                     (4, 0), (4, 1), (4, 2)]


def test_third_grid_dimension_stays():
    @T.prim_func
    def main(X: T.Tensor((5, 3, 2), T.float32)):
        with T.Kernel(3, 5, 2, threads=128) as (bx, by, bz):
            T.use_swizzle(2)
            for i in T.Parallel(1):
                X[by + i, bx, bz] = 1.0
    kernel = swizzled(build_kernel(main))
    assert [ir.as_int(g) for g in kernel.grid] == [15, 2]
    assert [v.name for v in kernel.block_vars] == ["block_id", "bz"]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic_rows"])
def test_swizzled_gemm_equals_unswizzled(dynamic):
    """A 5 x 3 grid of tiles (rows not a multiple of the panel of 2): every tile is computed,
    once, with the same values as in row-major block order."""
    M, N, K = 80, 48, 32
    A, B_ = randn(M, K, seed=0), randn(K, N, seed=1)
    outs = []
    for panel in (0, 2):
        kernel = swizzled(gemm(M, N, K, panel, T.dynamic("m") if dynamic else None))
        assert len(kernel.grid) == (1 if panel else 2)
        C = poisoned(M, N)
        args = {"m": M, "A": A, "B_": B_, "C": C}
        run(kernel, [args[p.name] for p in kernel.params])
        outs.append(C)
    torch.testing.assert_close(outs[0], A @ B_)
    assert torch.equal(outs[0], outs[1])
