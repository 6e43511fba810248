"""Frontend: IR built from T.* programs, and every user error located at the user's line."""
from __future__ import annotations

import linecache
import os

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import interpreter, ir, printer, verify
from tilews.lowering.frontend import build_kernel

from .helpers import marked_line

INTERNAL_DIR = os.path.dirname(ir.__file__)


def build(prim):
    return verify.run(build_kernel(prim))


def assert_error_at(fn, prim_factory, fragment: str, marker: str = "# <- error"):
    with pytest.raises(tilews.CompileError) as info:
        build(prim_factory())
    e = info.value
    assert fragment in e.message, e.message
    assert e.loc is not None and e.loc.line == marked_line(fn, marker), str(e)
    assert e.loc.file == __file__
    line = linecache.getline(__file__, e.loc.line)
    assert len(line) - len(line.lstrip()) <= e.loc.col < len(line.rstrip()), "caret outside the code"
    text = str(e)
    assert INTERNAL_DIR not in text and "visitor.py" not in text, text
    return e


# ----------------------------------------------------------------------------------------------
# IR construction


def gemm_factory(M, N, K, bm=64, bn=64, bk=32, dtype=T.float16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * bm, bx * bn])
    return main


def test_gemm_ir_text():
    k = build(gemm_factory(128, 96, 100))
    assert printer.to_text(k) == """\
kernel main(A: global f16[128, 100], B: global f16[100, 96], C: global f16[128, 96]) grid=(2, 2) threads=128:
  blocks bx, by
  alloc A_s: shared f16[64, 32]
  alloc B_s: shared f16[32, 64]
  alloc C_f: fragment f32[64, 64]
  fill C_f[0:+64, 0:+64] = 0.0:f32
  for k in pipelined(0, 4, 1) stages=3:
    copy A[(by * 64):+64, (k * 32):+32] -> A_s[0:+64, 0:+32]
    copy B[(k * 32):+32, (bx * 64):+64] -> B_s[0:+32, 0:+64]
    gemm A_s[0:+64, 0:+32], B_s[0:+32, 0:+64] -> C_f[0:+64, 0:+64]
  copy C_f[0:+64, 0:+64] -> C[(by * 64):+64, (bx * 64):+64]
"""


def test_every_statement_has_the_users_line():
    k = build(gemm_factory(64, 64, 64))
    src_line = marked_line(gemm_factory, "T.gemm(A_s, B_s, C_f)")
    gemms = [s for s in _walk(k.body) if isinstance(s, ir.Gemm)]
    assert [g.loc.line for g in gemms] == [src_line]
    assert all(s.loc.file == __file__ for s in _walk(k.body))


def _walk(s):
    from tilews.lowering.traverse import walk
    return list(walk(s))


def test_tilelang_spellings_and_dtype_strings():
    @T.prim_func
    def main(A: T.Tensor[(64, 64), "float"], B: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=256) as bx:
            T.create_list_of_mbarrier(128, 128)
            A_s = T.alloc_shared((64, 64), "float")
            with T.ws(0):
                T.copy(A[0:64, 0:64], A_s)
                T.mbarrier_arrive(T.get_mbarrier(0))
            with T.ws(1):
                T.mbarrier_wait_parity(0, 0)
                for i, j in T.Parallel(64, 64):
                    B[i, j] = T.cast(A_s[i, j] * 2.0, "float16")
    k = build(main)
    text = printer.to_text(k)
    assert "A: global f32[64, 64]" in text and "B: global f16[64, 64]" in text
    assert "barrier_arrive mbarrier[0]" in text and "barrier_wait mbarrier[0] parity=0" in text
    assert "ws(0):" in text and "ws(1):" in text


def test_build_time_python_is_evaluated():
    @T.prim_func
    def main(A: T.Tensor((4, 64), T.float32)):
        with T.Kernel(1) as bx:
            for r in [0, 2]:                     # a Python list: unrolled at build time
                for j in T.Parallel(64):
                    A[r, j] = A[r, j] + (r + 1)
    k = build(main)
    stores = [s for s in _walk(k.body) if isinstance(s, ir.Store)]
    assert [printer.expr(s.value) for s in stores] == ["(A[0, j] + 1.0:f32)", "(A[2, j_1] + 3.0:f32)"]


def test_runtime_if_and_dynamic_dims():
    @T.prim_func
    def main(X: T.Tensor((T.dynamic("m"), 32), T.float32), Y: T.Tensor((T.dynamic("m"), 32), T.float32)):
        with T.Kernel(T.ceildiv(m, 16)) as bx:
            for i, j in T.Parallel(16, 32):
                if bx * 16 + i < m:
                    Y[bx * 16 + i, j] = T.exp(X[bx * 16 + i, j])
    k = build(main)
    assert [p.name for p in k.params] == ["m", "X", "Y"]  # runtime dims first, as discovered
    assert printer.expr(k.grid[0]) == "(((m + 16) - 1) // 16)"
    assert any(isinstance(s, ir.If) for s in _walk(k.body))


@pytest.mark.parametrize("flag, kept", [(False, "False"), (True, "(X[0] > 0.0:f32)")])
def test_and_or_with_a_build_time_flag_fold(flag, kept):
    # `runtime and flag` is the flag's decision or the runtime test, never `x & False`: a branch
    # that cannot run is dropped at build time instead of being compiled by Triton
    @T.prim_func
    def main(X: T.Tensor((8,), T.float32), Y: T.Tensor((8,), T.float32)):
        with T.Kernel(1) as bx:
            if X[0] > 0 and flag:
                for i in T.Parallel(8):
                    Y[i] = X[i]
            if X[0] > 0 or not flag:
                for i in T.Parallel(8):
                    Y[i] = X[i]
    conds = [printer.expr(s.cond) for s in _walk(build(main).body) if isinstance(s, ir.If)]
    assert conds == [kept, "True" if not flag else "(X[0] > 0.0:f32)"]


# ----------------------------------------------------------------------------------------------
# errors at the user's line


def test_unsupported_syntax():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1) as bx:
                while True:  # <- error
                    pass
        return main
    assert_error_at(f, f, "unsupported statement in a kernel: While")


def test_persistent_domain_and_bindings_are_checked():
    def three_d():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(4) as b:
                for u in T.Persistent([2, 2, 2], 4, b):  # <- error
                    T.fill(A[0:16], 0)
        return main

    def two_names():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(4) as b:
                for u, v in T.Persistent([8], 4, b):  # <- error
                    T.fill(A[0:16], 0)
        return main

    def one_name():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(4) as b:
                for u in T.Persistent([2, 4], 4, b):  # <- error
                    T.fill(A[0:16], 0)
        return main
    assert_error_at(three_d, three_d, "T.Persistent takes a 1-d or 2-d domain, got 3 extents")
    assert_error_at(two_names, two_names, "T.Persistent over a 1-d domain binds 1 index(es), got 2")
    assert_error_at(one_name, one_name, "T.Persistent over a 2-d domain binds 2 index(es), got 1")


def test_persistent_over_units_binds_the_unit_number():
    # 10 units over 4 blocks (u = b, b + 4, b + 8 < 10), each writing its number into the tile
    # T.grouped_tile gives it: a 5 x 2 domain in panels of 2 rows
    @T.prim_func
    def main(A: T.Tensor((40,), T.float32)):
        with T.Kernel(4) as b:
            for u in T.Persistent([10], 4, b):
                by, bx = T.grouped_tile(u, [5, 2], 2)
                for i in T.Parallel(4):
                    A[(by * 2 + bx) * 4 + i] = T.cast(u, T.float32)
    loop = next(s for s in _walk(build(main).body) if isinstance(s, ir.For))
    assert loop.kind is ir.ForKind.PERSISTENT
    a = torch.full((40,), float("nan"))
    interpreter.run(build(main), [a])
    want = torch.empty(40)
    for u in range(10):
        first = u // 4 * 2
        rows = min(5 - first, 2)
        by, bx = first + u % 4 % rows, u % 4 // rows
        want[(by * 2 + bx) * 4:(by * 2 + bx + 1) * 4] = u
    assert torch.equal(a, want)


def test_undefined_name():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1) as bx:
                T.fill(A_s, 0)  # <- error
        return main
    assert_error_at(f, f, "name 'A_s' is not defined")


def test_gemm_k_mismatch():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64, 64), T.float16)):
            with T.Kernel(1) as bx:
                a = T.alloc_shared((64, 32), T.float16)
                b = T.alloc_shared((16, 64), T.float16)
                c = T.alloc_fragment((64, 64), T.float32)
                T.gemm(a, b, c)  # <- error
        return main
    e = assert_error_at(f, f, "T.gemm: A is 64x32 but B is 16x64 (K differs)")
    assert e.notes


def test_copy_tile_mismatch():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64, 64), T.float16)):
            with T.Kernel(1) as bx:
                a = T.alloc_shared((32, 32), T.float16)
                T.copy(A[0:64, 0:16], a)  # <- error
        return main
    assert_error_at(f, f, "source tile [64, 16] and destination tile [32, 32] differ")


def test_runtime_shape_rejected():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64, 64), T.float16)):
            with T.Kernel(4) as bx:
                a = T.alloc_shared((bx, 32), T.float16)  # <- error
        return main
    assert_error_at(f, f, "shape must be positive ints known at build time")


def test_python_name_reassigned_in_runtime_loop():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1) as bx:
                acc = 0
                for k in T.serial(4):
                    acc = acc + k  # <- error
        return main
    e = assert_error_at(f, f, "'acc' (bound at line")
    assert "T.alloc_local" in str(e)


def test_runtime_value_as_python_bool():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(4) as bx:
                x = [1, 2][bx]  # <- error
        return main
    assert_error_at(f, f, "runtime value cannot be used where a build-time integer is needed")


def test_foreign_exception_is_located():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1) as bx:
                n = 64 // 0  # <- error
        return main
    assert_error_at(f, f, "ZeroDivisionError")


def test_missing_kernel_block():
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32)):
        pass
    with pytest.raises(tilews.CompileError, match="has no `with T.Kernel"):
        build(main)


def test_tile_op_outside_kernel_is_a_plain_error():
    with pytest.raises(tilews.CompileError, match="can only be used inside a kernel"):
        T.clear(None)


def test_nested_roles():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                with T.ws(0):
                    with T.ws(1):  # <- error
                        pass
        return main
    assert_error_at(f, f, "roles cannot nest")


def test_overlapping_roles():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=384) as bx:
                s = T.alloc_shared((64,), T.float32)
                with T.ws(0, 1):
                    T.fill(s, 1)
                with T.ws(1, 2):  # <- error
                    T.fill(s, 2)
        return main
    assert_error_at(f, f, "share warp group(s) [1]")


def test_role_beyond_threads():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                s = T.alloc_shared((64,), T.float32)
                with T.ws(2):  # <- error
                    T.fill(s, 1)
        return main
    assert_error_at(f, f, "gives warp groups 0..1")


@pytest.mark.parametrize("threads", [4096, 1056, 48, 0])
def test_threads_beyond_a_block_or_not_whole_warps(threads):
    # issue 9: threads=4096 (over a GPU block's 1024) compiled, and ran on the interpreter.
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=threads) as bx:  # <- error
                T.fill(A, 1)
        return main
    assert_error_at(f, f, f"T.Kernel(threads=...) must be a multiple of 32 (the warp size) from 32 "
                          f"to 1024 (a GPU block's limit; every target checks it), got {threads}")


def test_zero_size_dimension_names_the_value():
    # issue 9: "dimension 0 of parameter 'A'" read as an index, not as the size 0.
    def f():
        @T.prim_func
        def main(A: T.Tensor((64, 0), T.float32)):  # <- error
            with T.Kernel(1) as bx:
                T.fill(A, 1)
        return main
    assert_error_at(f, f, "parameter 'A' has size 0 in dimension 1; sizes must be positive")


def test_fragment_shared_by_two_roles():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                frag = T.alloc_fragment((64,), T.float32)
                with T.ws(0):
                    T.fill(frag, 1)
                with T.ws(1):
                    T.copy(frag, A[0:64])  # <- error
        return main
    assert_error_at(f, f, "registers belong to one role")


def test_barrier_op_outside_roles():
    # tile operations outside roles are block-wide steps (tests/test_language_compat.py); barrier
    # operations have no role to arrive for
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                s = T.alloc_shared((64,), T.float32)
                bar = T.alloc_barrier(arrive_count=128)
                T.barrier_arrive(bar)  # <- error
                with T.ws(1):
                    T.copy(s, A[0:64])
        return main
    assert_error_at(f, f, "this barrierarrive is outside all roles")


def test_barrier_parity_must_be_0_or_1():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1) as bx:
                bar = T.alloc_barrier(arrive_count=128)
                T.barrier_wait(bar, 2)  # <- error
        return main
    assert_error_at(f, f, "parity must be 0 or 1")


def test_copy_with_barrier_must_be_global_to_shared():
    def f():
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1) as bx:
                bar = T.alloc_barrier(arrive_count=128)
                s = T.alloc_shared((64,), T.float32)
                T.copy(s, A[0:64], barrier=bar)  # <- error
        return main
    assert_error_at(f, f, "only for global -> shared copies")
