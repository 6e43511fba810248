"""TileLang's language surface on tilews (issue 12, item 4): the constructs TileLang's examples
need, one test each. The examples' programs themselves (the warp-specialized GEMMs, layernorm,
rms_norm, flash attention, the fp8 GEMMs) live in ``tests/tilelang_compat/``, which runs them on
``target="interpret"`` and ``"triton"`` and compiles them for ``"hopper"``.

The constructs: slices whose extent is an expression (and one that is not a constant);
allocations inside role blocks used by later blocks (a two-consumer program with private P
buffers, run on both CPU targets and compiled for ``"hopper"``), scalars bound inside roles,
allocations of one name in each role; statements outside every role (block-wide steps);
``T.tma_copy`` in both directions; the errors that name a wrong argument (``T.tma_copy``,
keyword barrier operations, ``T.gemm``'s ``policy`` / ``k_pack``, ``T.use_swizzle``,
``T.atomic_add(memory_order=...)``, scopes and dtypes); ``T.Pipelined``'s hints, ``T.Serial`` /
``T.vectorized`` / ``range``; ``T.dtype`` and dtypes as strings, typed constants, ``T.Cast`` /
``astype``, ``determine_fp8_type``; ``T.use_swizzle``'s keywords.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.language.fp8 import determine_fp8_type
from tilews.lowering import ir

from .helpers import marked_line, randn, rel_err
from .tilelang_compat.test_warp_specialize import copy_gemm_0_1_for

TARGETS = ["interpret", "triton"]


def build(factory, *args, target="interpret", out_idx=-1, **kw):
    return tilews.jit(out_idx=out_idx, target=target)(factory)(*args, **kw)


def gemm_ref(a, b):
    return a.double() @ b.double()


def error_at(fn, factory, fragment: str, *args, target="interpret"):
    """Building ``factory`` fails with ``fragment`` at the line of ``fn`` marked ``# <- error``."""
    with pytest.raises(tilews.CompileError) as info:
        build(factory, *args, target=target)
    e = info.value
    assert fragment in e.message, e.message
    assert e.loc is not None and e.loc.line == marked_line(fn), str(e)
    return e


def test_slice_whose_extent_is_an_expression():
    def f(B, S, H, D, bM):
        @T.prim_func
        def main(Q: T.Tensor((B, S, H, D), T.float16), O: T.Tensor((B, S, H, D), T.float16)):
            with T.Kernel(T.ceildiv(S, bM), H, B, threads=128) as (bx, by, bz):
                Q_s = T.alloc_shared((bM, D), T.float16)
                T.copy(Q[bz, bx * bM:(bx + 1) * bM, by, :], Q_s)
                T.copy(Q_s, O[bz, bx * bM:(bx + 1) * bM, by, :])
        return main
    q = randn(2, 100, 3, 32, dtype=torch.float16, seed=13)      # 100 rows: a masked last tile
    for target in TARGETS:
        assert torch.equal(build(f, 2, 100, 3, 32, 64, target=target)(q), q)


def test_slice_whose_extent_is_not_a_constant():
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(4, threads=128) as bx:
                s = T.alloc_shared((16,), T.float32)
                T.copy(A[bx * 16:(bx + 1) * 32], s)  # <- error
                T.copy(s, B[bx * 16])
        return main
    e = error_at(f, f, "slice (bx * 16):((bx + 1) * 32) of dimension 0 of 'A'", 64)
    assert "not a build-time constant" in e.message


def two_consumers_allocating_in_their_roles(D):
    """Producer T.ws(0) and consumers T.ws(1), T.ws(2): every buffer is allocated inside the
    role block that first uses it; the consumers' private P and accumulators are used again in
    later blocks of the same role, A_s and B1/B2 by other roles."""
    M, K, N = 64, 64, 2 * D

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float16)):
        with T.Kernel(1, threads=384) as bx:
            with T.ws(0):
                ready = T.alloc_barrier(arrive_count=128)
                A_s = T.alloc_shared((M, K), T.float16)
                B1 = T.alloc_shared((K, D), T.float16)
                B2 = T.alloc_shared((K, D), T.float16)
                T.copy(A[0, 0], A_s)
                T.copy(B[0, 0], B1)
                T.copy(B[0, D], B2)
                T.barrier_arrive(ready)
            with T.ws(1):
                acc1 = T.alloc_fragment((M, D), T.float32)
                P1 = T.alloc_shared((M, D), T.float16)
                T.barrier_wait(ready, 0)
                T.gemm(A_s, B1, acc1, clear_accum=True)
            with T.ws(2):
                acc2 = T.alloc_fragment((M, D), T.float32)
                P2 = T.alloc_shared((M, D), T.float16)
                T.barrier_wait(ready, 0)
                T.gemm(A_s, B2, acc2, clear_accum=True)
            with T.ws(1):
                T.copy(acc1, P1)
                T.copy(P1, C[0, 0])
            with T.ws(2):
                T.copy(acc2, P2)
                T.copy(P2, C[0, D])
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_allocations_inside_roles_are_kernel_scoped(target):
    D = 64
    a, b = randn(64, 64, dtype=torch.float16, seed=14), randn(64, 2 * D, dtype=torch.float16, seed=15)
    kernel = build(two_consumers_allocating_in_their_roles, D, target=target)
    assert rel_err(kernel(a, b), gemm_ref(a, b)) < 2e-3
    # every allocation sits with the kernel body's, before the roles
    body = kernel.ir_before.body.stmts
    allocs = [s for s in body if isinstance(s, ir.Alloc)]
    assert len(allocs) == 8 and body[:8] == tuple(allocs)


def test_allocations_inside_roles_compile_for_hopper():
    kernel = build(two_consumers_allocating_in_their_roles, 64, target="hopper")
    assert kernel.report.target == "hopper", kernel.report.notes


def test_scalars_bound_inside_roles_stay_scoped():
    def f():
        @T.prim_func
        def main(A: T.Tensor((256,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                s = T.alloc_shared((128,), T.float32)
                with T.ws(0):
                    offset = bx * 128
                    T.copy(A[offset], s)
                with T.ws(1):
                    T.copy(s, A[offset + 128])  # <- error
        return main
    error_at(f, f, "'offset' was assigned inside a runtime loop or branch")


def test_block_wide_step_of_fragments_of_two_roles_is_refused():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64, 64), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                x = T.alloc_fragment((64, 64), T.float32)
                y = T.alloc_fragment((64, 64), T.float32)
                with T.ws(0):
                    T.clear(x)
                with T.ws(1):
                    T.clear(y)
                for i, j in T.Parallel(64, 64):  # <- error
                    x[i, j] = y[i, j]
                with T.ws(0):
                    T.copy(x, A)
        return main
    error_at(f, f, "uses registers of roles T.ws(0) and T.ws(1)")


def test_block_wide_step_orders_the_roles():
    """A statement outside every role: the role that uses what it touches runs it; with two
    users, the other arrives on `ready` before it and waits on `done` after it, at the parity of
    the loop's iteration count (copy_gemm_0_1's copy of A's tile)."""
    def f(n):
        @T.prim_func
        def main(A: T.Tensor((n, 128), T.float32), C: T.Tensor((n, 128), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                s = T.alloc_shared((128,), T.float32)
                for k in T.serial(n):
                    T.copy(A[k, 0], s)
                    with T.ws(1):
                        T.copy(s, C[k, 0])
        return main
    a = randn(5, 128, seed=16)
    for target in TARGETS:
        kernel = build(f, 5, target=target)
        assert torch.equal(kernel(a), a)
    text = kernel.ir_text("before")
    assert "block_step" not in text and "ws(1):\n      copy A" in text
    text = copy_gemm_0_1_for("interpret").compile(M=128, N=128, K=192, block_M=64, block_N=64,
                                                  block_K=32).ir_text("before")
    steps = text[text.index("for ko"):text.index("copy B")]
    assert steps.split("ws(") == [
        steps.split("ws(")[0], "1):\n      barrier_arrive block_step_ready[0]\n    ",
        "0):\n      barrier_wait block_step_ready[0] parity=(ko & 1)\n      copy A[(by * 64):+64, "
        "(ko * 32):+32] -> A_shared[0:+64, 0:+32]\n      barrier_arrive block_step_done[0]\n    ",
        "1):\n      barrier_wait block_step_done[0] parity=(ko & 1)\n    ", "1):\n      "]


@pytest.mark.parametrize("target", TARGETS)
def test_tma_copy_load_and_store(target):
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N, 64), T.float16), B: T.Tensor((N, 64), T.float16)):
            with T.Kernel(T.ceildiv(N, 64), threads=128) as bx:
                s = T.alloc_shared((64, 64), T.float16)
                bar = T.alloc_barrier(arrive_count=128)
                T.tma_copy(A[bx * 64, 0], s, barrier=bar)
                T.barrier_arrive(bar)
                T.barrier_wait(bar, 0)
                T.tma_copy(s, B[bx * 64, 0])
        return main
    a = randn(128, 64, dtype=torch.float16, seed=17)
    assert torch.equal(build(f, 128, target=target)(a), a)


def ops_kernel(op):
    """A kernel whose body calls ``op(A, s, f, bar)``: a global tensor, a shared tile, a fragment
    and a barrier."""
    @T.prim_func
    def main(A: T.Tensor((64, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((64, 64), T.float16)
            f = T.alloc_fragment((64, 64), T.float32)
            bar = T.alloc_barrier(arrive_count=128)
            op(A, s, f, bar)  # <- error
    return main


@pytest.mark.parametrize("op,fragment", [
    (lambda A, s, f, bar: T.tma_copy(A[0, 0], s), "needs barrier=..."),
    (lambda A, s, f, bar: T.tma_copy(s, A[0, 0], barrier=bar), "shared to global memory takes no "
                                                                "barrier"),
    (lambda A, s, f, bar: T.tma_copy(A[0, 0], f, barrier=bar), "global -> shared or shared -> "
                                                                "global memory, not global -> "
                                                                "fragment"),
    (lambda A, s, f, bar: T.mbarrier_arrive(mbarrier=bar, cta_id=1), "(thread-block clusters) is "
                                                                      "not supported"),
    (lambda A, s, f, bar: T.gemm(s, s, f, polcy=T.GemmWarpPolicy.FullRow),
     "unexpected keyword argument 'polcy'"),
    (lambda A, s, f, bar: T.gemm(s, s, f, policy=3), "must be a T.GemmWarpPolicy"),
    (lambda A, s, f, bar: T.gemm(s, s, f, k_pack=0), "T.gemm(k_pack=0): must be an int >= 1"),
    (lambda A, s, f, bar: T.use_swizzle(8, order="column"), "order='column') is not supported"),
    (lambda A, s, f, bar: T.atomic_add(A[0, 0], 1.0, memory_order="sequential"),
     "memory_order='sequential'"),
    (lambda A, s, f, bar: T.alloc_shared((64, 64), "float16", "local"),
     "must be 'shared.dyn' or 'shared'"),
    (lambda A, s, f, bar: T.fill(f, T.uint8(256)), "256 is out of range for uint8 [0, 255]"),
    (lambda A, s, f, bar: T.alloc_shared((64, 64), "float17"), "unknown dtype 'float17'"),
], ids=lambda x: "" if callable(x) else x[:40])
def test_errors_name_the_argument(op, fragment):
    error_at(ops_kernel, ops_kernel, fragment, op)


def test_pipelined_takes_tilelang_hints_only():
    def f(N, **hints):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                s = T.alloc_shared((32,), T.float32)
                for k in T.Pipelined(N // 32, **hints):  # <- error
                    T.copy(A[k * 32], s)
                    T.copy(s, B[k * 32])
        return main
    a = randn(128, seed=18)
    hints = dict(num_stages=2, order=[0, 1], stage=[0, 0], group=[[0], [1]], sync=[[0, 1]])
    assert torch.equal(build(f, 128, **hints)(a), a)
    error_at(f, lambda N: f(N, num_stage=2), "unexpected keyword argument 'num_stage'", 128)


def test_loops_serial_vectorized_and_range():
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                acc = T.alloc_local((1,), T.float32)
                acc[0] = 0
                for i in range(N // 4):
                    for j in T.vectorized(4):
                        acc[0] += A[i * 4 + j]
                for i in T.Serial(N):
                    for j in T.Parallel(1):
                        B[i + j] = acc[0] + i
        return main
    a = randn(64, seed=19)
    for target in TARGETS:
        kernel = build(f, 64, target=target)
        torch.testing.assert_close(kernel(a), a.sum() + torch.arange(64.0), rtol=1e-5, atol=1e-5)
    assert kernel.ir_text("before").count("in serial(") == 3


def test_dtypes_are_their_tilelang_names():
    import numpy as np
    assert T.float16 == "float16" and "bfloat16" == T.bfloat16 and T.float32 != "float16"
    assert hash(T.float16) == hash("float16") and {"float16": 1}[T.float16] == 1
    assert str(T.float8_e4m3fn) == "float8_e4m3fn" and f"{T.int32}" == "int32"
    assert getattr(torch, T.bfloat16) is torch.bfloat16
    for spelling, want in [("float", T.float32), ("half", T.float16), (torch.bfloat16, T.bfloat16),
                           (int, T.int32), (float, T.float32), (bool, T.bool),
                           (np.float16, T.float16), (np.dtype("uint8"), T.uint8),
                           ("e4m3_float8", T.float8_e4m3fn), (T.uint32, T.uint32)]:
        assert T.dtype(spelling) is want, spelling
    assert T.float is T.float32 and T.bool is T.boolean
    assert T.dtype("float8_e5m2").as_torch() is torch.float8_e5m2
    assert (T.float16.bits, T.float16.bytes, T.uint64.bits, T.bool.bytes) == (16, 2, 64, 1)
    assert not isinstance(T.dtype, T.DType) and isinstance(T.float16, T.dtype)
    with pytest.raises(ValueError, match="unknown dtype 'float17'"):
        T.dtype("float17")
    assert determine_fp8_type() is T.float8_e4m3fn and determine_fp8_type("e5m2") is T.float8_e5m2
    with pytest.raises(ValueError, match="'e3m4'"):
        determine_fp8_type("e3m4")


@pytest.mark.parametrize("target", TARGETS)
def test_typed_constants_casts_and_string_dtypes(target):
    def f(N, D):
        @T.prim_func
        def main(A: T.Tensor((N,), "float16"), B: T.Tensor((N,), "float"),
                 C: T.Tensor((N,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_fragment((N,), "float")
                m = T.alloc_fragment((N,), "float")
                T.fill(m, -T.infinity("float"))
                for i in T.Parallel(N):
                    a[i] = A[i].astype("float") * T.float32(0.5) + T.Cast("float", D)
                for i in T.Parallel(N):
                    B[i] = T.max(a[i], m[i]) / T.Cast(T.float32, D)
                    C[i] = T.cast(A[i], "int32") + T.int32(T.uint32(1))
        return main
    a = randn(64, dtype=torch.float16, seed=20) * 4
    b, c = build(f, 64, 3, target=target, out_idx=[1, 2])(a)
    torch.testing.assert_close(b, (a.float() * 0.5 + 3) / 3, rtol=1e-6, atol=1e-6)
    assert torch.equal(c, a.float().trunc().int() + 1)


def test_cast_of_a_python_number_is_a_typed_constant():
    def f():
        @T.prim_func
        def main(A: T.Tensor((4,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                for i in T.Parallel(4):
                    A[i] = T.Cast(T.float32, 7) + T.uint32(1)
        return main
    kernel = build(f)
    assert "7.0:f32" in kernel.ir_text("before") and "1:u32" in kernel.ir_text("before")
    assert torch.equal(kernel(), torch.full((4,), 8.0))


def test_use_swizzle_keywords():
    def f(N, **kw):
        @T.prim_func
        def main(A: T.Tensor((N, N), T.float32), B: T.Tensor((N, N), T.float32)):
            with T.Kernel(N // 32, N // 32, threads=128) as (bx, by):
                T.use_swizzle(**kw)
                s = T.alloc_shared((32, 32), T.float32)
                T.copy(A[by * 32, bx * 32], s)
                T.copy(s, B[by * 32, bx * 32])
        return main
    a = randn(128, 128, seed=21)
    on = build(f, 128, panel_size=2)
    off = build(f, 128, panel_size=2, enable=False)
    assert on.ir_before.swizzle_panel == 2 and off.ir_before.swizzle_panel == 0
    assert torch.equal(on(a), a) and torch.equal(off(a), a)


def test_each_role_may_allocate_under_the_same_name():
    def f():
        @T.prim_func
        def main(A: T.Tensor((2, 128), T.float32), B: T.Tensor((2, 128), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                for g in [0, 1]:               # a build-time loop: one role per iteration
                    with T.ws(g):
                        s = T.alloc_shared((128,), T.float32)
                        T.copy(A[g, 0], s)
                        T.copy(s, B[g, 0])
        return main
    a = randn(2, 128, seed=22)
    kernel = build(f)
    assert torch.equal(kernel(a), a)
    assert "alloc s_1: shared" in kernel.ir_text("before")


def test_atomic_add_use_tma_is_a_hint():
    """TileLang's ``use_tma=True`` asks for a bulk reduce-add of a tile; tilews chooses how the add
    is done, notes the hint at its line, and the sums are the same."""
    def f(M, N, bM):
        @T.prim_func
        def main(X: T.Tensor((M, N), T.float32), Acc: T.Tensor((bM, N), T.float32)):
            with T.Kernel(T.ceildiv(M, bM), threads=128) as bx:
                tile = T.alloc_fragment((bM, N), T.float32)
                T.copy(X[bx * bM, 0], tile)
                T.atomic_add(Acc, tile, use_tma=True)  # <- the hinted add
        return main
    x = randn(64, 32, seed=21)
    for target in TARGETS:
        k = build(f, 64, 32, 16, target=target, out_idx=None)
        acc = randn(16, 32, seed=22)
        want = acc.double() + x.double().reshape(4, 16, 32).sum(0)
        k(x, acc)
        assert rel_err(acc, want) < 1e-6, target
        line = marked_line(test_atomic_add_use_tma_is_a_hint, "the hinted" + " add")
        assert any(n.startswith(f"line {line}: T.atomic_add(use_tma=True)") for n in k.report.notes)
