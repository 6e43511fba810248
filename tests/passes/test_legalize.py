"""legalize: copy mechanisms, lower-bound masks, 64-bit offsets, matrix instructions, warps and
tile-shape rules per target."""
from pathlib import Path

import pytest

import tilews.language as T
from tilews.lowering import ir, printer
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import legalize
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import StreamPlan
from tilews.lowering.interpreter.backend import INTERPRET
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.triton_ext.tl.backend import TRITON_CPU, TRITON_GPU
from tilews.lowering.traverse import subexprs, walk

THIS = Path(__file__)


def line_of(marker: str) -> int:
    lines = [n for n, text in enumerate(THIS.read_text().splitlines(), 1)
             if text.rstrip().endswith(marker)]
    assert len(lines) == 1, marker
    return lines[0]


def gemm(M, N, K, bm=64, bn=64, bk=32, threads=128, dtype=T.bfloat16):
    """C = A @ B (TileLang style); direct style specs so any dim may be T.dynamic."""
    @T.prim_func
    def main(A, B, C):
        with T.Kernel(T.ceildiv(C.shape[1], bn), T.ceildiv(C.shape[0], bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(A.shape[1], bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * bm, bx * bn])
    specs = {"A": T.Tensor((M, K), dtype), "B": T.Tensor((K, N), dtype), "C": T.Tensor((M, N), dtype)}
    return build_kernel(main, specs)


def rows(M, extent):
    """X *= 2 over row blocks of ``extent`` rows, in an unrolled loop."""
    @T.prim_func
    def main(X):
        with T.Kernel(1, threads=128) as bx:
            for u in T.unroll(0, T.ceildiv(X.shape[0], extent)):
                for i, j in T.Parallel(extent, 64):  # <- parallel
                    X[u * extent + i, j] = X[u * extent + i, j] * 2.0
    return build_kernel(main, {"X": T.Tensor((M, 64), T.float32)})


def odd_fragment():
    @T.prim_func
    def main(X: T.Tensor((48, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            F = T.alloc_fragment((48, 64), T.float32)  # <- fragment
            T.copy(X, F)
            T.copy(F, X)
    return build_kernel(main)


def legalized(kernel, target):
    return lower(kernel, target, upto="legalize")


def test_gemm_interpreter(expect):
    expect(printer.to_text(legalized(gemm(128, 128, 80), TRITON_CPU)))


def test_gemm_gpu_dynamic_m(expect):
    expect(printer.to_text(legalized(gemm(T.dynamic("m"), 128, 128), TRITON_GPU)))


def test_num_warps_rounds_down(expect):
    expect(printer.to_text(legalized(gemm(128, 128, 128, threads=384), TRITON_GPU)))


@pytest.mark.parametrize("target", [HOPPER, INTERPRET], ids=["hopper", "interpret"])
def test_warp_specialized_targets_get_only_decisions(target):
    names = target.pipeline.pass_names
    before = lower(gemm(128, 128, 80), target, upto=names[names.index("legalize") - 1])
    k = legalize.run(before, target)
    assert k.plans == before.plans
    copies = [s.mechanism for s in walk(k.body) if isinstance(s, ir.Copy)]
    assert ir.CopyMechanism.UNDECIDED not in copies and ir.CopyMechanism.MASKED in copies
    assert {s.instr for s in walk(k.body) if isinstance(s, ir.Gemm)} == {ir.GemmInstr.DOT}


def test_out_of_range_starts_are_masked():
    k = legalized(gemm(96, 128, 128, bm=64), TRITON_GPU)  # the second row block overhangs
    assert [s.mechanism for s in walk(k.body) if isinstance(s, ir.Copy)] == [
        ir.CopyMechanism.MASKED, ir.CopyMechanism.DIRECT, ir.CopyMechanism.MASKED]


def test_odd_extents_are_padded_on_triton_targets():
    # a [48, 64] fragment and a T.Parallel of [48, 64]: Triton's tensors are [64, 64], the rows
    # from 48 on padding (Hopper's warp-specialized path legalizes it without a StreamPlan)
    for kernel in (odd_fragment(), rows(64, 48)):
        for target in (TRITON_CPU, TRITON_GPU):
            plan = legalized(kernel, target).plan(StreamPlan)
            assert plan.padded_tiles and plan.tile((48, 64, 3, 1, 192)) == (64, 64, 4, 1, 256)
    legalized(rows(64, 48), HOPPER)


def test_unroll_with_runtime_bounds(expect):
    expect(printer.to_text(legalized(rows(T.dynamic("m"), 64), TRITON_CPU)))


def halo(M, shift):
    """B[rows] = A[rows - shift] (a halo copy through shared memory) and C[i] = A[i - 1] + A[i]
    element by element: starts that may be negative."""
    @T.prim_func
    def main(A, B, C):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            A_s = T.alloc_shared((16, 32), T.float32)
            T.copy(A[bx * 16 - shift, 0], A_s)
            T.copy(A_s, B[bx * 16 - shift, 0])
            for i, j in T.Parallel(16, 32):
                C[bx * 16 + i, j] = A[bx * 16 + i - 1, j] + A[bx * 16 + i, (j + 31) % 32]
    spec = T.Tensor((M, 32), T.float32)
    return build_kernel(main, {"A": spec, "B": spec, "C": spec})


def test_negative_starts_mask_the_lower_bound(expect):
    expect(printer.to_text(legalized(halo(64, 4), TRITON_CPU)))


def test_mask_low_on_every_target():
    for target in (HOPPER, INTERPRET, TRITON_GPU):
        k = legalized(halo(64, 0), target)
        copies = [s for s in walk(k.body) if isinstance(s, ir.Copy)]
        assert [c.mechanism for c in copies] == [ir.CopyMechanism.DIRECT] * 2
        assert [r.mask_low for c in copies for r in (c.src, c.dst)] == [(False, False), (), (), (False, False)]
        store = next(s for s in walk(k.body) if isinstance(s, ir.Store))
        loads = [x for x in subexprs(store.value) if isinstance(x, ir.Load)]
        assert store.mask_low == (False, False)
        assert [x.mask_low for x in loads] == [(True, False), (False, False)]


def test_wide_offsets_where_a_buffer_may_hold_2_31_elements():
    def plan(*shape, dtype=T.uint8):
        @T.prim_func
        def main(X, Y: T.Tensor((16, 16), dtype)):
            with T.Kernel(1, threads=128) as bx:
                X_s = T.alloc_shared((16, 16), dtype)
                T.copy(X[0, 0], X_s)
                T.copy(X_s, Y)
        return legalized(build_kernel(main, {"X": T.Tensor(shape, dtype)}), TRITON_GPU).plan(StreamPlan)
    assert plan(32832, 65536).wide_offsets == ("X",)            # 2**31 + 2**22 elements
    assert plan(32768, 65536).wide_offsets == ("X",)            # exactly 2**31
    assert plan(32767, 65536).wide_offsets == ()                # one row less
    assert plan(T.dynamic("m"), 16).wide_offsets == ("X",)      # a runtime dim may be anything
