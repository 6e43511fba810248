"""The thread level's frontend (lowering/frontend/threads.py): per-thread code becomes block-wide
Tile IR — promoted locals, per-thread Parallels, masks, ragged loops, vector dimensions — and
what cannot run per thread is refused at the user's line. Numerics on the interpreter (the
definition) against float64 references."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.traverse import walk

from .helpers import marked_line
from .thread_programs import splitk_gemv as split_k_gemv


def interpreted(prog):
    return tilews.compile(prog, target="interpret")


def frontend_ir(prog) -> ir.Kernel:
    return interpreted(prog).ir_before


def test_per_thread_locals_become_fragments_over_the_thread_dims():
    k = frontend_ir(split_k_gemv(64, 512, 4, 32))
    allocs = {s.buffer.name: s.buffer for s in walk(k.body) if isinstance(s, ir.Alloc)}
    assert allocs["A_local"].scope is ir.Scope.FRAGMENT
    assert allocs["A_local"].static_shape == (32, 4, 8)        # (y, x) thread dims, then the local
    assert allocs["C_accum"].static_shape == (32, 4, 1)
    assert allocs["C_shared"].scope is ir.Scope.SHARED          # shared memory is not per thread
    per_thread = [s for s in walk(k.body) if isinstance(s, ir.Parallel) and s.per_thread]
    assert [p.extents for p in per_thread] == [(32, 4), (32, 4, 8), (32, 4), (32, 4), (32, 4)]
    # the vectorized loop is a vector dimension; the fold over k stays a loop around its Parallel
    loops = [s for s in walk(k.body) if isinstance(s, ir.For)]
    assert [(lp.var.name, ir.as_int(lp.stop)) for lp in loops] == [("bk", 2), ("k_1", 8)]
    assert not any(isinstance(v, ir.Var) and v.kind is ir.VarKind.THREAD
                   for s in walk(k.body) for v in _vars(s))


def _vars(s):
    from tilews.lowering.traverse import exprs_of, subexprs
    return [x for e in exprs_of(s) for x in subexprs(e)]


@pytest.mark.parametrize("block_n,reduce_threads", [(4, 32), (2, 64), (8, 16)])
def test_split_k_gemv_on_the_interpreter(block_n, reduce_threads):
    N, K = 64, 1024
    kern = interpreted(split_k_gemv(N, K, block_n, reduce_threads))
    a = torch.randn(K, dtype=torch.float16)
    b = torch.randn(N, K, dtype=torch.float16)
    c = torch.full((N,), float("nan"), dtype=torch.float16)
    kern(a, b, c)
    ref = b.double() @ a.double()
    torch.testing.assert_close(c.double(), ref, atol=2e-2, rtol=2e-3)


def test_ragged_per_thread_loops_and_branches():
    n = 64

    @T.prim_func
    def main(counts: T.Tensor((n,), T.int32), X: T.Tensor((n, 16), T.float32),
             Y: T.Tensor((n,), T.float32), Z: T.Tensor((n,), T.int32)):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            acc = T.alloc_var(T.float32, 0.0)
            seen = T.alloc_var(T.int32, 0)
            for i in T.serial(counts[tx]):           # a trip count of each thread's own
                if X[tx, i] > 0:
                    acc += X[tx, i]
                else:
                    seen += 1
            if acc > 1.0:
                Y[tx] = acc
            else:
                Y[tx] = -acc
            Z[tx] = seen

    kern = interpreted(main)
    counts = torch.randint(0, 17, (n,), dtype=torch.int32)
    x = torch.randn(n, 16)
    y = torch.full((n,), float("nan"))
    z = torch.full((n,), -7, dtype=torch.int32)
    kern(counts, x, y, z)
    for t in range(n):
        row = x[t, :counts[t]].double()
        s = row[row > 0].sum()
        assert y[t].item() == pytest.approx(float(s if s > 1.0 else -s), rel=1e-5, abs=1e-6)
        assert z[t].item() == int((row <= 0).sum())


def test_a_branch_that_changes_its_condition_is_evaluated_once():
    @T.prim_func
    def main(X: T.Tensor((128,), T.float32), Y: T.Tensor((128,), T.float32)):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            v = T.alloc_var(T.float32, X[tx])
            if v > 0:
                v = v - 10.0          # now negative: the else branch must not run as well
            else:
                v = v + 100.0
            Y[tx] = v

    x = torch.randn(128)
    y = torch.full((128,), float("nan"))
    interpreted(main)(x, y)
    torch.testing.assert_close(y, torch.where(x > 0, x - 10.0, x + 100.0))


def test_uniform_code_beside_per_thread_code_runs_once_per_block():
    @T.prim_func
    def main(X: T.Tensor((128,), T.float32), Y: T.Tensor((128,), T.float32)):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            S = T.alloc_shared((128,), T.float32)
            total = T.alloc_var(T.float32, 0.0)       # uniform: every thread computes the same
            for i in T.serial(4):
                total += X[i]
            S[tx] = X[tx] * 2.0
            Y[tx] = S[(tx + 1) % 128] + total         # a neighbour's shared element

    k = frontend_ir(main)
    allocs = {s.buffer.name: s.buffer for s in walk(k.body) if isinstance(s, ir.Alloc)}
    assert allocs["total"].scope is ir.Scope.LOCAL     # stays a per-block scalar
    x = torch.randn(128)
    y = torch.full((128,), float("nan"))
    interpreted(main)(x, y)
    torch.testing.assert_close(y, torch.roll(x, -1) * 2.0 + x[:4].sum(), rtol=1e-6, atol=1e-6)


def test_thread_binding_spellings_agree():
    @T.prim_func
    def main(Y: T.Tensor((4, 32), T.int32)):
        with T.Kernel(1, threads=(32, 4)):
            kr = T.thread_binding(0, 32, thread="threadIdx.x")
            ni = T.thread_binding(0, 4, thread="threadIdx.y")
            x, y = T.get_thread_bindings()
            Y[ni, kr] = (x + 32 * y) * 10 + T.get_thread_binding(1)

    y = torch.full((4, 32), -1, dtype=torch.int32)
    interpreted(main)(y)
    want = torch.arange(128, dtype=torch.int32).reshape(4, 32) * 10 + torch.arange(4)[:, None]
    assert torch.equal(y, want.to(torch.int32))


def _raises_at_mark(fn, match):
    with pytest.raises(tilews.CompileError, match=match) as info:
        interpreted(fn())
    assert info.value.loc.line == marked_line(fn)


def test_tile_operation_under_a_per_thread_branch_is_refused():
    def f():
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128):
                tx = T.get_thread_binding()
                S = T.alloc_shared((128,), T.float32)
                if tx < 64:
                    T.copy(X, S)  # <- error
        return main
    _raises_at_mark(f, "T.copy under a per-thread condition")


def test_barrier_under_a_per_thread_branch_is_refused():
    def f():
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128):
                tx = T.get_thread_binding()
                if tx < 16:
                    T.sync_threads()  # <- error
                X[tx] = 1.0
        return main
    _raises_at_mark(f, r"block barrier \(T.sync_threads\) under a per-thread condition")


def test_parallel_reading_a_thread_index_is_refused():
    def f():
        @T.prim_func
        def main(X: T.Tensor((128, 4), T.float32)):
            with T.Kernel(1, threads=128):
                tx = T.get_thread_binding()
                for j in T.Parallel(4):  # <- error
                    X[tx, j] = 1.0
        return main
    _raises_at_mark(f, "T.Parallel reads a thread index")


def test_per_thread_loop_step_is_refused():
    def f():
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128):
                tx = T.get_thread_binding()
                for i in T.serial(0, 8, tx + 1):  # <- error
                    X[tx] = 1.0
        return main
    _raises_at_mark(f, "a loop's step must be the same in every thread")


def test_thread_dimension_errors_name_the_kernels_threads():
    def f():
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=(32, 4)):
                t = T.thread_binding(0, 8, thread="threadIdx.y")  # <- error
                X[t] = 1.0
        return main
    _raises_at_mark(f, r"thread dimension 1 has 4 threads \(T.Kernel\(threads=\(32, 4\)\)\), not 8")

    def g():
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128):
                t = T.get_thread_binding(3)  # <- error
                X[t] = 1.0
        return main
    _raises_at_mark(g, "thread dimension must be 0, 1 or 2")


def test_a_local_indexed_past_its_size_by_a_thread_index_is_refused():
    def f():
        @T.prim_func
        def main(X: T.Tensor((32,), T.float32)):
            with T.Kernel(1, threads=32):
                t = T.get_thread_binding()
                v = T.alloc_local((1,), T.float32)
                v[0] = X[t]
                X[t] = v[(t + 1) % 32]  # <- error
        return main
    _raises_at_mark(f, r"index 0 of local 'v' \(shape \[1\]\) takes values 0..31, outside 0..0")
