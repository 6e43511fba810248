"""TileLang's declarations and hints on tilews: ``T.alloc_var`` variables (loop-carried, in
branches, as indices, in ``T.if_then_else``), ``T.alloc_local``'s shapes, ``T.alloc_global``
scratch, the loop forms (``T.Pipelined(start, stop, num_stages)``, ``T.serial`` / ``T.unroll``
with a step and TileLang's keywords), ``T.annotate_layout`` with ``T.Layout`` and
``tilews.layout.make_swizzled_layout``, the register hints (``T.set_max_nreg``,
``T.no_set_max_nreg``, ``T.disable_warp_group_reg_alloc``) and ``T.tfloat32``.

Programs are written as TileLang's examples write them and run on ``interpret`` and ``triton``
(against a float64 torch reference, random inputs, outputs poisoned by the test settings); what
reaches Hopper is compiled for it (no GPU needed); Metal runs through its CPU harness."""
from __future__ import annotations

import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.metal import harness

from .helpers import marked_line, randn
from .test_language_compat import build, error_at

TARGETS = ["interpret", "triton"]
needs_cxx = pytest.mark.skipif(harness.compiler() is None, reason="Metal's harness needs a C++17 compiler")


def notes(kernel) -> str:
    return "\n".join(kernel.report.notes)


# ----------------------------------------------------------------------------------------------
# T.alloc_var


def group_rows(G, N, bm, total):
    """Each block finds its group's first row by summing the sizes before it (TileLang's
    group_per_split_token_cast's ``row_offset``), then copies its ``bm`` rows scaled by the
    group's index, found by scanning offsets with ``T.if_then_else`` (grouped_gemm's
    ``cur_batch_idx``), through a ``range`` loop of the frontend's runtime kind."""
    @T.prim_func
    def main(sizes: T.Tensor((G,), T.int32), starts: T.Tensor((G,), T.int32),
             X: T.Tensor((total, N), T.float32), Y: T.Tensor((G * bm, N), T.float32)):
        with T.Kernel(G, threads=128) as bx:
            x = T.alloc_fragment((bm, N), T.float32)
            row_offset = T.alloc_var(dtype=T.int32)
            group = T.alloc_var(T.int32, -1)
            row_offset = 0
            for i in T.serial(bx):
                row_offset += sizes[i]
            for i in range(G):
                group = T.if_then_else(row_offset >= starts[i], i, group)
            T.copy(X[row_offset:row_offset + bm, 0:N], x)
            for i, j in T.Parallel(bm, N):
                x[i, j] = x[i, j] * (group + 1) + starts[group]
            T.copy(x, Y[bx * bm, 0])
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_alloc_var_offsets_and_if_then_else(target):
    G, N, bm = 4, 16, 8
    sizes = torch.tensor([9, 12, 8, 10], dtype=torch.int32)
    starts = torch.cumsum(sizes, 0, dtype=torch.int32) - sizes
    x = randn(int(sizes.sum()), N, seed=1)
    y = build(group_rows, G, N, bm, x.shape[0], target=target)(sizes, starts, x)
    ref = torch.cat([x[s:s + bm].double() * (g + 1) + float(s) for g, s in enumerate(starts.tolist())])
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)


def running(N, G):
    """Variables carried through a pipelined loop of runtime length, changed in an ``if`` and in
    a loop the frontend unrolls (a Python list), read after them; ``v[0]`` reads and writes the
    same value; a variable declared inside a loop starts again at each iteration."""
    @T.prim_func
    def main(X: T.Tensor((G, N), T.float32), lens: T.Tensor((G,), T.int32),
             Y: T.Tensor((G, 3), T.float32)):
        with T.Kernel(G, threads=128) as bx:
            acc = T.alloc_var(T.float32, init=0.5)
            best = T.alloc_var(T.float32, "local.var")
            steps = T.alloc_var(T.int32, 0, "local.var")
            best = -1e30
            for k in T.Pipelined(lens[bx], num_stages=2):
                acc = acc + X[bx, k]
                if X[bx, k] > best:
                    best = X[bx, k]
                steps[0] = steps[0] + 1
            for scale in [2.0, 3.0]:
                acc *= scale
            for r in T.serial(2):
                fresh = T.alloc_var(T.float32, 1.0)
                fresh += r
                steps = steps + fresh
            for i in T.Parallel(1):
                Y[bx, i] = acc
                Y[bx, i + 1] = best
                Y[bx, i + 2] = steps
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_alloc_var_loop_carried_in_branches_and_unrolled(target):
    G, N = 3, 24
    x = randn(G, N, seed=2)
    lens = torch.tensor([24, 5, 13], dtype=torch.int32)
    y = build(running, N, G, target=target)(x, lens)
    ref = torch.tensor([[(0.5 + x[g, :n].double().sum()) * 6, x[g, :n].max(), n + 1 + 2]
                        for g, n in enumerate(lens.tolist())], dtype=torch.float64)
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)


@needs_cxx
def test_alloc_var_on_metal():
    G, N, bm = 4, 16, 8
    sizes = torch.tensor([9, 12, 8, 10], dtype=torch.int32)
    starts = torch.cumsum(sizes, 0, dtype=torch.int32) - sizes
    x = randn(int(sizes.sum()), N, seed=3)
    y = build(group_rows, G, N, bm, x.shape[0], target="metal")(sizes, starts, x)
    ref = torch.cat([x[s:s + bm].double() * (g + 1) + float(s) for g, s in enumerate(starts.tolist())])
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)


def test_alloc_var_errors():
    def scope():
        @T.prim_func
        def main(Y: T.Tensor((1,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                v = T.alloc_var(T.int32, scope="shared")  # <- error
                for i in T.Parallel(1):
                    Y[i] = v
        return main
    error_at(scope, scope, "T.alloc_var(scope='shared')")

    def twice():
        @T.prim_func
        def main(Y: T.Tensor((1,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                v = T.alloc_var(T.int32, 1, init=2)  # <- error
                for i in T.Parallel(1):
                    Y[i] = v
        return main
    error_at(twice, twice, "initial value is given twice")

    def rebinding():
        @T.prim_func
        def main(Y: T.Tensor((4,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                n = 0
                for i in T.serial(4):
                    n = n + i  # <- error
        return main
    e = error_at(rebinding, rebinding, "reassigned inside a runtime loop")
    assert any("T.alloc_var" in n for n in e.notes)


# ----------------------------------------------------------------------------------------------
# T.alloc_local


@pytest.mark.parametrize("target", TARGETS)
def test_alloc_local_shapes(target):
    def f(N):
        @T.prim_func
        def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((3,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                s = T.alloc_local([1], T.float32)
                m = T.alloc_local(1, T.float32, "local")
                h = T.alloc_local((2,), T.float32)
                s[0] = 0
                m[0] = -1e30
                for i in T.serial(N):
                    s[0] += X[i]
                    m[0] = T.max(m[0], X[i])
                h[0], h[1] = s[0], m[0]
                for i in T.Parallel(1):
                    Y[i] = h[0]
                    Y[i + 1] = h[1]
                    Y[i + 2] = s[0] - m[0]
        return main
    x = randn(40, seed=4)
    y = build(f, 40, target=target)(x)
    ref = torch.tensor([x.double().sum(), x.max(), x.double().sum() - x.max()], dtype=torch.float64)
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# T.alloc_global


def scratch_round_trip(M, N, bm):
    """Each block writes its rows, scaled, to a scratch buffer and reads them back (TileLang's
    split-K partials); the blocks' rows are disjoint, so the program is race-free."""
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float32)):
        partial = T.alloc_global((M, N), T.float32)
        with T.Kernel(M // bm, threads=128) as bx:
            t = T.alloc_fragment((bm, N), T.float32)
            s = T.alloc_shared((bm, N), T.float32)
            T.copy(X[bx * bm, 0], t)
            for i, j in T.Parallel(bm, N):
                t[i, j] = t[i, j] * 3 + 1
            T.copy(t, partial[bx * bm, 0])
            T.copy(partial[bx * bm:(bx + 1) * bm, :], s)
            for i, j in T.Parallel(bm, N):
                Y[bx * bm + i, j] = s[i, j] - X[bx * bm + i, j]
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("blocks", [1, 2])
def test_alloc_global_is_scratch_no_caller_passes(target, blocks):
    M, N = 32, 16
    k = build(scratch_round_trip, M, N, M // blocks, target=target)
    assert [p.name for p in k.params] == ["X", "Y"] and k.out_idx == [1]
    assert "scratch=(partial)" in k.ir_text("before")
    for seed in (5, 6):                       # the second call reuses the first's workspace
        x = randn(M, N, seed=seed)
        torch.testing.assert_close(k(x).double(), x.double() * 2 + 1, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match=r"takes 1 argument\(s\) \(X\)"):
        k(x, x)


@pytest.mark.parametrize("target", TARGETS)
def test_alloc_global_with_a_runtime_dimension(target):
    def f(N):
        @T.prim_func
        def main(X: T.Tensor((T.dynamic("m"), N), T.float32), Y: T.Tensor((T.dynamic("m"), N), T.float32)):
            m = T.dynamic("m")
            rows = T.alloc_global((m, N), T.float32)
            with T.Kernel(T.ceildiv(m, 16), threads=128) as bx:
                t = T.alloc_fragment((16, N), T.float32)
                T.copy(X[bx * 16, 0], t)
                for i, j in T.Parallel(16, N):
                    t[i, j] = t[i, j] + j
                T.copy(t, rows[bx * 16, 0])
                T.copy(rows[bx * 16, 0], t)
                T.copy(t, Y[bx * 16, 0])
        return main
    k = build(f, 8, target=target)
    for m in (16, 40):
        x = randn(m, 8, seed=m)
        torch.testing.assert_close(k(x).double(), x.double() + torch.arange(8.0, dtype=torch.float64))


@pytest.mark.parametrize("target", TARGETS)
def test_alloc_global_and_alloc_var_in_the_eager_style(target):
    @tilews.jit(target=target)
    def scale(X, bm=16):
        M, N = T.const("M, N")
        X: T.Tensor((M, N), T.float32)
        Y = T.empty((M, N), T.float32)
        staged = T.alloc_global((M, N), T.float32)
        with T.Kernel(M // bm, threads=128) as bx:
            t = T.alloc_fragment((bm, N), T.float32)
            c = T.alloc_var(T.float32, 2.0)
            c += bx
            T.copy(X[bx * bm, 0], t)
            for i, j in T.Parallel(bm, N):
                t[i, j] = t[i, j] * c
            T.copy(t, staged[bx * bm, 0])
            T.copy(staged[bx * bm, 0], t)
            T.copy(t, Y[bx * bm, 0])
        return Y
    x = randn(48, 8, seed=16)
    factor = (2.0 + torch.arange(48, dtype=torch.float64) // 16).reshape(48, 1)
    torch.testing.assert_close(scale(x).double(), x.double() * factor, rtol=1e-6, atol=1e-6)


def test_alloc_global_errors():
    def size():
        @T.prim_func
        def main(X: T.Tensor((8,), T.float32)):
            w = T.alloc_global((0, 8), T.float32)  # <- error
            with T.Kernel(1, threads=128) as bx:
                T.copy(X, w[0, :])
        return main
    error_at(size, size, "T.alloc_global: size 0 of dimension 0")

    def scope():
        @T.prim_func
        def main(X: T.Tensor((8,), T.float32)):
            w = T.alloc_global((8,), T.float32, scope="shared")  # <- error
            with T.Kernel(1, threads=128) as bx:
                T.copy(X, w)
        return main
    error_at(scope, scope, "T.alloc_global(scope='shared')")


@needs_cxx
def test_alloc_global_on_metal():
    M, N = 32, 16
    x = randn(M, N, seed=7)
    y = build(scratch_round_trip, M, N, 16, target="metal")(x)
    torch.testing.assert_close(y.double(), x.double() * 2 + 1, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# loops


@pytest.mark.parametrize("target", TARGETS)
def test_loop_forms(target):
    def f(N):
        @T.prim_func
        def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((4,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                s = T.alloc_shared((8,), T.float32)
                a = T.alloc_var(T.float32, 0.0)
                b = T.alloc_var(T.float32, 0.0)
                c = T.alloc_var(T.float32, 0.0)
                d = T.alloc_var(T.float32, 0.0)
                for k in T.Pipelined(1, N // 8, 2, annotations={"note": 1}):
                    T.copy(X[k * 8], s)
                    for i in T.serial(8):
                        a += s[i]
                for i in T.serial(1, N, 3, annotations={}):
                    b += X[i]
                for i in T.unroll(0, N, 5, explicit=True):
                    c += X[i]
                for i in T.Unroll(4, unroll_factor=2):
                    d += X[i]
                for i in T.Parallel(1, coalesced_width=4, loop_layout=None):
                    Y[i] = a
                    Y[i + 1] = b
                    Y[i + 2] = c
                    Y[i + 3] = d
        return main
    x = randn(64, seed=8).double()
    y = build(f, 64, target=target)(x.float())
    ref = torch.stack([x[8:].sum(), x[1::3].sum(), x[::5].sum(), x[:4].sum()])
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_unroll_explicit_and_factor_exclude_each_other():
    def f():
        @T.prim_func
        def main(Y: T.Tensor((1,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                for i in T.unroll(4, explicit=True, unroll_factor=2):  # <- error
                    pass
        return main
    error_at(f, f, "explicit and unroll_factor exclude each other")


# ----------------------------------------------------------------------------------------------
# T.annotate_layout


def make_dq_layout(dQ):
    """TileLang's flash-attention backward reorders its dQ accumulator (a global tensor)."""
    return T.Layout(dQ.shape, lambda l, d: [l // 8, d // 8, d % 2, 4 * (l % 8) + (d % 8) // 2])


def transposed(i, j):
    """An index function given as a layout (TileLang wraps it in a T.Layout)."""
    return [j, i]


def gemm_program(M, N, K, block, dtype=T.float16, annotate=True):
    """C = A @ B through shared tiles; with ``annotate``, TileLang's layout annotations (C is
    then the reordered dQ of ``make_dq_layout``)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             dQ: T.Tensor((M, N), T.float32)):
        with T.Kernel(N // block, M // block, threads=128) as (bx, by):
            A_shared = T.alloc_shared((block, K), dtype)
            B_shared = T.alloc_shared((K, block), str(dtype))
            C_local = T.alloc_fragment((block, block), T.float32)
            if annotate:
                T.annotate_layout({A_shared: tilews.layout.make_swizzled_layout(A_shared),
                                   B_shared: tilews.layout.make_swizzled_layout(B_shared)})
                T.annotate_layout({dQ: make_dq_layout(dQ)})  # <- layout
                T.annotate_layout({C_local: transposed})  # <- function
            T.clear(C_local)
            T.copy(A[by * block, 0], A_shared)
            T.copy(B[0, bx * block], B_shared)
            T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, dQ[by * block, bx * block])
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_annotate_layout_records_what_it_does_not_apply(target):
    M, N, K = 32, 32, 16
    k = build(gemm_program, M, N, K, 16, target=target)
    a, b = randn(M, K, dtype=torch.float16, seed=9), randn(K, N, dtype=torch.float16, seed=10)
    torch.testing.assert_close(k(a, b).double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)
    text = notes(k)
    assert "A_shared" not in text and "B_shared" not in text     # swizzled shared: honoured
    line = marked_line(gemm_program, "# <- layout")
    assert f"line {line}: T.annotate_layout: a layout given as an index function for global buffer 'dQ'" in text
    line = marked_line(gemm_program, "# <- function")
    assert f"line {line}: T.annotate_layout: a layout given as an index function for fragment buffer 'C_local'" in text


def test_annotate_layout_errors():
    def key():
        @T.prim_func
        def main(Y: T.Tensor((8,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                T.annotate_layout({"Y": tilews.layout.make_swizzled_layout(Y)})  # <- error
        return main
    error_at(key, key, "keys must be buffers")

    def layout():
        @T.prim_func
        def main(Y: T.Tensor((8,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                T.annotate_layout({Y: 3})  # <- error
        return main
    error_at(layout, layout, "the layout of 'Y' must be a T.Layout")


# ----------------------------------------------------------------------------------------------
# register hints


def ws_gemm(M, N, K, block_M, block_N, block_K, producer_regs=40, consumer_regs=232, var=False):
    """TileLang's copy_0_gemm_1 warp-specialized GEMM with a register request in each role (and,
    with ``var``, a T.alloc_var counting the consumer's tiles into a correction term)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_K, block_N), T.float16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            data_is_ready = T.alloc_barrier(arrive_count=128)
            compute_is_done = T.alloc_barrier(arrive_count=128)
            with T.ws(1):
                T.set_max_nreg(consumer_regs, 1)
                T.clear(C_local)
            if var:
                tiles = T.alloc_var(T.int32)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=0):
                with T.ws(0):
                    T.dec_max_nreg(producer_regs)
                    T.barrier_wait(compute_is_done, (ko + 1) % 2)
                    T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                    T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                    T.barrier_arrive(data_is_ready)
                with T.ws(1):
                    T.barrier_wait(data_is_ready, ko % 2)
                    T.gemm(A_shared, B_shared, C_local)
                    T.barrier_arrive(compute_is_done)
                    if var:
                        tiles += 1
            with T.ws(1):
                if var:
                    for i, j in T.Parallel(block_M, block_N):
                        C_local[i, j] = C_local[i, j] + tiles
                T.copy(C_local, C[by * block_M, bx * block_N])
    return main


def test_register_requests_reach_gluon():
    k = tilews.jit(target="hopper")(ws_gemm)(512, 512, 256, 128, 128, 64)
    assert k.report.target == "hopper", k.report.notes
    src = k.get_kernel_source()
    assert re.search(r"gl\.warp_specialize\(\[.*\], \[1\], \[40\]\)", src), src[-2000:]
    consumer = "legalize_wgmma: T.ws(1) asked for 232 registers (T.set_max_nreg)"
    assert consumer in notes(k) and "gets what the other roles leave" in notes(k)


def test_alloc_var_in_a_warp_specialized_gemm_compiles_for_hopper():
    k = tilews.jit(target="hopper")(ws_gemm)(512, 512, 256, 128, 128, 64, var=True)
    assert k.report.target == "hopper", k.report.notes


@pytest.mark.parametrize("target", TARGETS)
def test_register_requests_elsewhere_are_noted(target):
    M, N, K = 64, 64, 128
    k = build(ws_gemm, M, N, K, 64, 64, 32, 40, 232, True, target=target)
    a, b = randn(M, K, dtype=torch.float16, seed=11), randn(K, N, dtype=torch.float16, seed=12)
    torch.testing.assert_close(k(a, b).double(), a.double() @ b.double() + K // 32, rtol=2e-3, atol=2e-2)
    if target == "triton":
        assert "register requests (T.set_max_nreg) do not apply" in notes(k)

    def top():
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32), Y: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                T.set_max_nreg(240, 1)  # <- set
                T.disable_warp_group_reg_alloc()  # <- off
                T.no_set_max_nreg()
                T.copy(X, Y)
        return main
    k = build(top, target=target)
    x = randn(128, seed=13)
    assert torch.equal(k(x), x)
    text = notes(k)
    assert f"line {marked_line(top, '# <- set')}: T.set_max_nreg(240, 1) outside every T.ws block" in text
    assert f"line {marked_line(top, '# <- off')}: T.no_set_max_nreg()" in text


@pytest.mark.parametrize("call, fragment", [
    ("T.set_max_nreg(250, 1)", "must be a multiple of 8 from 24 to 256"),
    ("T.set_max_nreg(16, 0)", "must be a multiple of 8 from 24 to 256"),
    ("T.set_max_nreg(240, 2)", "is_inc=2"),
])
def test_register_request_out_of_range(call, fragment):
    n = int(re.search(r"\((\d+)", call).group(1))
    inc = int(re.search(r", (\d+)\)", call).group(1))

    def f():
        @T.prim_func
        def main(Y: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                with T.ws(0):
                    T.set_max_nreg(n, inc)  # <- error
        return main
    error_at(f, f, fragment)


def test_one_role_asks_for_one_register_count():
    def f():
        @T.prim_func
        def main(Y: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                with T.ws(0):
                    T.set_max_nreg(40, 0)
                with T.ws(0):
                    T.set_max_nreg(48, 0)  # <- error
        return main
    error_at(f, f, "this role already asked for 40 registers")


# ----------------------------------------------------------------------------------------------
# T.tfloat32


@pytest.mark.parametrize("target", TARGETS)
def test_tfloat32_is_float32_storage_with_tf32_gemms(target):
    assert T.tfloat32 is T.float32 and T.dtype("tfloat32") is T.float32
    M, N, K = 32, 32, 16
    k = build(gemm_program, M, N, K, 16, "tfloat32", False, target=target)   # TileLang spelling
    a, b = randn(M, K, seed=14), randn(K, N, seed=15)
    torch.testing.assert_close(k(a, b).double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)
    assert "ieee" not in k.ir_text("before")        # the gemm allows tf32 (GemmPrecision.TF32)


@pytest.mark.parametrize("target", TARGETS)
def test_kernel_threads_given_as_a_tuple_count_their_product(target):
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(T.ceildiv(N, 128), threads=(32, 4)) as bx:
                for i in T.Parallel(128):
                    if bx * 128 + i < N:
                        B[bx * 128 + i] = A[bx * 128 + i] * 3
        return main
    kernel = build(f, 300, target=target)
    assert kernel.ir_before.threads == 128
    a = randn(300, seed=21)
    torch.testing.assert_close(kernel(a), 3 * a)


@pytest.mark.parametrize("target", TARGETS)
def test_a_name_bound_to_an_expression_of_a_variable_keeps_the_value_it_had(target):
    """``x = v + 1`` is a let-binding (TileLang's semantics): storing into ``v`` afterwards does
    not change ``x``; nor does a loop that updates ``v`` change names bound before it."""
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128):
                v = T.alloc_var(T.int32, init=3)
                before = v + 1                 # 4
                for k in T.serial(5):
                    v = v + k                  # 3 + 0 + 1 + 2 + 3 + 4 = 13
                after = v * 2                  # 26
                v = 0
                for i in T.Parallel(N):
                    B[i] = A[i] * before + after
        return main
    a = randn(64, seed=31)
    torch.testing.assert_close(build(f, 64, target=target)(a), a * 4 + 26)
