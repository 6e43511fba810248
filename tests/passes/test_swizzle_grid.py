"""swizzle_grid: T.use_swizzle's panel order is one linear grid, decided in lowering."""
import torch

import tilews.language as T
from tilews.lowering import ir, printer
from tilews.lowering.frontend import build_kernel
from tilews.lowering.interpreter import run
from tilews.lowering.pipeline import lower
from tilews.lowering.simplify import evaluate
from tilews.lowering.interpreter.backend import INTERPRET
from tilews.lowering.traverse import walk

from examples.gemm import matmul

from ..helpers import poisoned, randn

TILE = 16   # the edge of every tile


def tile_copy(M, N, panel, m=None):
    """Y = X, one 16 x 16 tile per block of a (ceil(N / 16), ceil(M / 16)) grid; ``m``
    (T.dynamic) makes the row count, and so the grid, a runtime value."""
    @T.prim_func
    def main(X, Y):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(X.shape[0], TILE), threads=128) as (bx, by):
            T.use_swizzle(panel)
            t = T.alloc_fragment((TILE, TILE), T.float32)
            T.copy(X[by * TILE, bx * TILE], t)
            T.copy(t, Y[by * TILE, bx * TILE])
    spec = T.Tensor((M if m is None else m, N), T.float32)
    return build_kernel(main, {"X": spec, "Y": spec})


def gemm(M, N, K, panel):
    """examples/gemm.py with 16 x 16 x 16 blocks in float32."""
    blocks = dict(block_M=TILE, block_N=TILE, block_K=TILE, num_stages=2)
    return build_kernel(matmul.fn(M, N, K, swizzle=panel, dtype=T.float32, **blocks))


def swizzled(kernel):
    return lower(kernel, INTERPRET, upto="swizzle_grid")


def test_tile_copy(expect):
    expect(printer.to_text(swizzled(tile_copy(80, 48, panel=2))))


def test_blocks_visit_panels_of_rows():
    """5 rows of 3 tiles in panels of 2 rows (the last panel has one): block i stores the i-th
    tile (by, bx) of the list below."""
    kernel = swizzled(tile_copy(80, 48, panel=2))
    assert kernel.swizzle_panel == 0 and [ir.as_int(g) for g in kernel.grid] == [15]
    store = [s for s in walk(kernel.body) if isinstance(s, ir.Copy) and s.dst.buffer.name == "Y"]
    block, = kernel.block_vars
    order = []
    for i in range(15):
        env = {block: i}
        for v, e in kernel.block_defs:      # computed once per block, in order
            env[v] = evaluate(e, env)
        order.append(tuple(evaluate(st, env) // TILE for st in store[0].dst.starts))
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


def test_swizzled_gemm_equals_unswizzled():
    """A 5 x 3 grid of tiles (rows not a multiple of the panel of 2): every tile is computed,
    once, with the same values as in row-major block order."""
    M, N, K = 80, 48, 32
    a, b = randn(M, K, seed=0), randn(K, N, seed=1)
    outs = []
    for panel in (0, 2):
        kernel = swizzled(gemm(M, N, K, panel))
        assert len(kernel.grid) == (1 if panel else 2)
        C = poisoned(M, N)
        run(kernel, [a, b, C])
        outs.append(C)
    torch.testing.assert_close(outs[0], a @ b)
    assert torch.equal(outs[0], outs[1])


def test_runtime_grid():
    """With the row count a runtime value the grid is the product of the two extents."""
    kernel = swizzled(tile_copy(80, 48, panel=2, m=T.dynamic("m")))
    m = next(p for p in kernel.params if p.name == "m")
    assert [evaluate(g, {m: 70}) for g in kernel.grid] == [5 * 3]
    X = randn(70, 48, seed=2)
    Y = poisoned(70, 48)
    args = {"m": 70, "X": X, "Y": Y}
    run(kernel, [args[p.name] for p in kernel.params])
    assert torch.equal(Y, X)
