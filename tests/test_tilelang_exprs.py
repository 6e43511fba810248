"""TileLang's small tile and scalar operations on every backend: ``T.reduce_absmax``,
``T.cumsum``, ``T.reinterpret``, ``T.clamp`` / ``T.ceil`` / ``T.floordiv`` / ``T.floormod`` /
``T.shift_left``, and the TVM names TileLang programs import (``tilews.tvm``: ``DataType``,
``tirx.const`` / ``Cast`` / ``reinterpret`` / ``Select`` / ``Min``).

Programs are written as TileLang users write them (a factory returning a ``@T.prim_func``, built
with ``tilews.jit(out_idx=..., target=...)``) and run on ``interpret`` and ``triton`` (Triton's
CPU interpreter) and on ``metal`` (the MSL through the CPU harness) against float64 torch
references, outputs poisoned before launch; bit-casts are compared bit for bit with
``torch.Tensor.view``. For ``hopper`` (compile-only here): the Gluon source and TTGIR of a
warp-specialized GEMM whose epilogue takes a row absmax, and the fallback to ``triton.language``
(with its reason) for a scan, which the Gluon emitter does not spell.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.metal import harness
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.tvm import DataType, UnprovidedTVMName, tirx

from .helpers import gluon_program, marked_line, poisoned, randn
from .test_language_compat import error_at

CPU_TARGETS = ["interpret", "triton"]
needs_cxx = pytest.mark.skipif(harness.compiler() is None, reason="the Metal harness needs a C++17 compiler")
TARGETS = CPU_TARGETS + [pytest.param("metal", marks=needs_cxx)]


def build(factory, *args, target="interpret", out_idx=-1, **kw):
    return tilews.jit(out_idx=out_idx, target=target)(factory)(*args, **kw)


def prefix_sums(x: torch.Tensor, dim: int, reverse: bool) -> torch.Tensor:
    x = x.double()
    return x.flip(dim).cumsum(dim).flip(dim) if reverse else x.cumsum(dim)


# ----------------------------------------------------------------------------------------------
# T.reduce_absmax and T.cumsum


def absmax_rows(M, N, dim, scope, clear=True):
    """Amax = max |A| over ``dim`` (combined with Init's values when not ``clear``)."""
    out = N if dim == 0 else M

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), Init: T.Tensor((out,), T.float32),
             Amax: T.Tensor((out,), T.float32)):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((M, N), T.float32) if scope == "shared" else \
                T.alloc_fragment((M, N), T.float32)
            m = T.alloc_fragment((out,), T.float32)
            T.copy(A, a)
            T.copy(Init, m)
            T.reduce_absmax(a, m, dim=dim, clear=clear)
            T.copy(m, Amax)
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("scope", ["shared", "fragment"])
@pytest.mark.parametrize("dim", [0, 1])
def test_reduce_absmax(target, scope, dim):
    M, N = 16, 64
    a, init = randn(M, N, seed=1), randn(N if dim == 0 else M, seed=2)
    k = build(absmax_rows, M, N, dim, scope, target=target)
    torch.testing.assert_close(k(a, init).double(), a.double().abs().amax(dim), rtol=0, atol=0)
    k = build(absmax_rows, M, N, dim, scope, clear=False, target=target)
    want = torch.maximum(a.double().abs().amax(dim), init.double())
    torch.testing.assert_close(k(a, init).double(), want, rtol=0, atol=0)


def per_token_cast_to_fp8(M, N, blk_m, out_dtype=T.float8_e4m3fn):
    """TileLang's ``cast/example_per_token_cast_to_fp8.py``: per-row scales from the row absmax,
    values clamped to the e4m3 range (stored as ``out_dtype``)."""
    fp8_min, fp8_max = -448.0, 448.0

    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), X_fp8: T.Tensor((M, N), out_dtype),
             X_amax: T.Tensor((M,), T.float32)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            y_local = T.alloc_fragment((blk_m, N), T.float32)
            y_amax_local = T.alloc_fragment((blk_m,), T.float32)
            y_s_local = T.alloc_fragment((blk_m,), T.float32)
            y_q_local = T.alloc_fragment((blk_m, N), T.float32)
            T.copy(X[bx * blk_m:(bx + 1) * blk_m, :], y_local)
            T.reduce_absmax(y_local, y_amax_local, dim=1)
            for i in T.Parallel(blk_m):
                y_amax_local[i] = T.max(y_amax_local[i], 1e-4)
                y_s_local[i] = y_amax_local[i] / fp8_max
            for i, j in T.Parallel(blk_m, N):
                y_q_local[i, j] = T.clamp(y_local[i, j] / y_s_local[i], fp8_min, fp8_max)
            T.copy(y_q_local, X_fp8[bx * blk_m:(bx + 1) * blk_m, :])
            T.copy(y_amax_local, X_amax[bx * blk_m:(bx + 1) * blk_m])
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["float8_e4m3fn", "float32"])
def test_per_token_cast_to_fp8(target, out):
    """Exact against torch's float32 arithmetic (the example's), the row absmax exactly; the
    float8 output bitwise on Triton's CPU interpreter too (its own float32 -> e4m3 rounding lost
    the carry into the exponent, 31.9 -> 16: tilews rounds on the bits there)."""
    M, N = 40, 64
    x = randn(M, N, seed=3) * 10
    q, amax = build(per_token_cast_to_fp8, M, N, 16, T.dtype(out), out_idx=[1, 2], target=target)(x)
    want_amax = x.abs().amax(1).clamp(min=1e-4)
    assert torch.equal(amax, want_amax)
    want_q = (x / (want_amax / 448.0)[:, None]).clamp(-448.0, 448.0)
    assert torch.equal(q.float(), want_q.to(getattr(torch, out)).float())


def scan(M, N, dim, reverse, scope, dtype=T.float32, in_place=True):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(1, threads=128):
            alloc = T.alloc_shared if scope == "shared" else T.alloc_fragment
            a = alloc((M, N), dtype)
            T.copy(A, a)
            if in_place:
                T.cumsum(a, dim=dim, reverse=reverse)
                T.copy(a, B)
            else:
                b = alloc((M, N), dtype)
                T.cumsum(src=a, dst=b, dim=dim, reverse=reverse)
                T.copy(b, B)
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("scope", ["shared", "fragment"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(target, scope, dim, reverse):
    M, N = 16, 64
    a = randn(M, N, seed=4)
    b = build(scan, M, N, dim, reverse, scope, target=target)(a)
    torch.testing.assert_close(b.double(), prefix_sums(a, dim, reverse), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_cumsum_into_another_buffer_and_in_float16(target):
    M, N = 32, 32
    a = randn(M, N, seed=5)
    b = build(scan, M, N, 0, True, "fragment", in_place=False, target=target)(a)
    torch.testing.assert_close(b.double(), prefix_sums(a, 0, True), rtol=1e-5, atol=1e-5)
    h = randn(M, N, dtype=torch.float16, seed=6)
    out = poisoned(M, N, dtype=torch.float16)
    build(scan, M, N, 1, False, "shared", T.float16, out_idx=None, target=target)(h, out)
    # summed in float32, rounded once to float16
    torch.testing.assert_close(out, prefix_sums(h, 1, False).to(torch.float16), rtol=1e-3, atol=1e-3)


def test_cumsum_errors_name_the_buffers():
    def f(M):
        @T.prim_func
        def main(A: T.Tensor((M, M), T.float32), B: T.Tensor((M, M), T.float32)):
            with T.Kernel(1, threads=128):
                a = T.alloc_shared((M, M), T.float32)
                b = T.alloc_shared((M, M // 2), T.float32)
                T.copy(A, a)
                T.cumsum(a, b, dim=1)  # <- error
                T.copy(a, B)
        return main
    e = error_at(f, f, "T.cumsum: dst 'b'", 16)
    assert "src 'a'" in e.message


# ----------------------------------------------------------------------------------------------
# hopper (compile-only): absmax in Gluon, the scan through triton.language


def ws_gemm_row_absmax(M, N, K, bm, bn, bk, scan=False):
    """A producer T.ws(0) feeds a consumer T.ws(1) whose epilogue stores max |C| of each row of
    its tile: Amax[bx, row] (with ``scan``, their prefix sums down the tile's rows)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             Amax: T.Tensor((N // bn, M), T.float32)):
        with T.Kernel(N // bn, M // bm, threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            amax = T.alloc_fragment((bm,), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            done = T.alloc_barrier(arrive_count=128)
            with T.ws(1):
                T.clear(C_f)
            for ko in range(K // bk):
                with T.ws(0):
                    T.barrier_wait(done, (ko + 1) % 2)
                    T.copy(A[by * bm, ko * bk], A_s)
                    T.copy(B[ko * bk, bx * bn], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A_s, B_s, C_f)
                    T.barrier_arrive(done)
            with T.ws(1):
                T.reduce_absmax(C_f, amax, dim=1)
                if scan:
                    T.cumsum(amax)  # <- scan
                T.copy(amax, Amax[bx, by * bm])
    return main


WS_SIZES = (128, 256, 128, 64, 128, 64)       # M, N, K, block_M, block_N, block_K


def ws_row_absmax_ref(a, b, bm, bn):
    c = a.double() @ b.double()
    return c.abs().reshape(c.shape[0], -1, bn).amax(2).T


def test_ws_gemm_absmax_epilogue_runs_and_compiles_for_gluon():
    M, N, K, bm, bn, bk = WS_SIZES
    a, b = randn(M, K, dtype=torch.float16, seed=7), randn(K, N, dtype=torch.float16, seed=8)
    amax = build(ws_gemm_row_absmax, *WS_SIZES)(a, b)
    torch.testing.assert_close(amax.double(), ws_row_absmax_ref(a, b, bm, bn), rtol=1e-5, atol=1e-4)
    lowered = lower(build_kernel(ws_gemm_row_absmax(*WS_SIZES)), HOPPER)
    assert lowered.find_plan(AsyncPlan) is not None
    program = gluon_program(lowered)
    assert "gl.max(gl.abs(" in program.source
    ttgir = program.asm["ttgir"]
    assert "tt.reduce" in ttgir and "math.absf" in ttgir
    assert "arith.maxnumf" in ttgir or "arith.maximumf" in ttgir


def test_ws_gemm_scan_epilogue_runs_and_falls_back_from_gluon():
    """The Gluon emitter does not spell a scan: on hopper the program compiles through
    triton.language, and the report says why, at the scan's line."""
    M, N, K, bm, bn, bk = WS_SIZES
    a, b = randn(M, K, dtype=torch.float16, seed=7), randn(K, N, dtype=torch.float16, seed=8)
    out = build(ws_gemm_row_absmax, *WS_SIZES, scan=True)(a, b)
    want = ws_row_absmax_ref(a, b, bm, bn).reshape(N // bn, M // bm, bm).cumsum(2).reshape(N // bn, M)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-3)
    k = build(ws_gemm_row_absmax, *WS_SIZES, scan=True, target="hopper")
    assert k.report.target == "hopper -> triton"
    line = marked_line(ws_gemm_row_absmax, "# <- scan")
    assert any(f"does not spell cumsum yet (line {line})" in n for n in k.report.notes), k.report.notes
    assert "tl.cumsum(" in k.get_kernel_source()


def test_hopper_cast_falls_back_to_triton_language():
    k = build(per_token_cast_to_fp8, 128, 64, 16, out_idx=[1, 2], target="hopper")
    assert k.report.target == "hopper -> triton"
    assert "tl.max(tl.abs(" in k.get_kernel_source()


# ----------------------------------------------------------------------------------------------
# T.reinterpret and the scalar math names


def bitcast_elements(n, src, dst):
    @T.prim_func
    def main(A: T.Tensor((n,), src), B: T.Tensor((n,), dst), C: T.Tensor((n,), src)):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(n):
                B[i] = T.reinterpret(A[i], dst)
                C[i] = T.reinterpret(T.reinterpret(A[i], dst), src)
    return main


BITCASTS = [(torch.float32, torch.uint32), (torch.float16, torch.uint16),
            (torch.float16, torch.int16), (torch.bfloat16, torch.int16), (torch.int32, torch.float32)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("src,dst", BITCASTS, ids=lambda d: str(d).split(".")[-1])
def test_reinterpret_is_bit_exact(target, src, dst):
    if target == "metal" and torch.bfloat16 in (src, dst):
        pytest.skip("the harness's bfloat is a float")
    n = 128
    if src.is_floating_point:
        a = randn(n, dtype=src, seed=9)
    else:      # bit patterns of finite float32 numbers
        a = randn(n, seed=9).view(src)
    b, c = build(bitcast_elements, n, T.dtype(src), T.dtype(dst), out_idx=[1, 2], target=target)(a)
    assert torch.equal(b, a.view(dst))
    assert torch.equal(c.view(torch.int8), a.view(torch.int8))


def float_math(n):
    """T.ceil / T.clamp on floats; T.floordiv / T.floormod / T.shift_left on ints (negative
    ones included, as Python floors)."""
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), I: T.Tensor((n,), T.int32), F: T.Tensor((n, 2), T.float32),
             J: T.Tensor((n, 3), T.int32)):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(n):
                F[i, 0] = T.ceil(X[i] * 4.0)
                F[i, 1] = T.clamp(X[i], -0.5, 0.75)
                J[i, 0] = T.floordiv(I[i], 7)
                J[i, 1] = T.floormod(I[i], 7)
                J[i, 2] = T.shift_left(1, I[i] & 15) + T.shift_left(I[i], 2)
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_scalar_math_names(target):
    n = 128
    x = randn(n, seed=10)
    ints = torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(11),
                         dtype=torch.int32)
    f, j = build(float_math, n, out_idx=[2, 3], target=target)(x, ints)
    assert torch.equal(f[:, 0], torch.ceil(x * 4.0))
    assert torch.equal(f[:, 1], x.clamp(-0.5, 0.75))
    i64 = ints.long()
    assert torch.equal(j[:, 0].long(), torch.div(i64, 7, rounding_mode="floor"))
    assert torch.equal(j[:, 1].long(), torch.remainder(i64, 7))
    assert torch.equal(j[:, 2].long(), (1 << (i64 & 15)) + i64 * 4)


# ----------------------------------------------------------------------------------------------
# tilews.tvm: TileLang's TVM names for dtypes and bit-level arithmetic


def _u8_to_f4_to_f16(nbit: int, val: tirx.PrimExpr, pos: tirx.PrimExpr) -> tirx.PrimExpr:
    """Nibble ``pos`` of the uint8 ``val`` (an e2m1 FP4: sign, 2 exponent bits, 1 mantissa bit)
    as float16, written with TVM's names as TileLang's dequantize examples write it (zero and the
    subnormal 0.5 as TVM's Select of a constant)."""
    mask = tirx.const((1 << nbit) - 1, T.uint16)
    f4 = (val >> (pos.astype(T.uint16) * tirx.const(nbit, T.uint16))) & mask
    s = f4 >> tirx.const(3, T.uint16)
    e_f4 = (f4 & tirx.const(6, T.uint16)) >> tirx.const(1, T.uint16)
    m_f4 = f4 & tirx.const(1, T.uint16)
    e_f16 = e_f4 + tirx.const(14, T.uint16)
    bits = ((s << tirx.const(15, T.uint16)) | (e_f16 << tirx.const(10, T.uint16))
            | (m_f4 << tirx.const(9, T.uint16))).astype(T.uint16)
    normal = tirx.reinterpret(T.float16, bits)
    sign = tirx.Select(s == tirx.const(0, T.uint16), tirx.const(1, T.float16), tirx.const(-1, T.float16))
    subnormal = tirx.Select(m_f4 == tirx.const(0, T.uint16), tirx.const(0, T.float16),
                            sign * tirx.const(0.5, T.float16))
    return tirx.Select(e_f4 == tirx.const(0, T.uint16), subnormal, normal)


def fp4_decode(n):
    storage = T.uint8
    assert DataType(storage).bits == 8 and DataType("float16").bits == 16
    per_byte = 8 // 4

    @T.prim_func
    def main(Packed: T.Tensor((n // per_byte,), storage), Out: T.Tensor((n,), T.float16),
             Clamped: T.Tensor((n,), T.int32)):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(n):
                Out[i] = _u8_to_f4_to_f16(4, Packed[i // per_byte], i % per_byte)
                Clamped[i] = tirx.Cast(T.int32, tirx.Min(Packed[i // per_byte], tirx.const(100, storage)))
    return main


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize("target", TARGETS)
def test_tvm_style_fp4_decode(target):
    n = 256
    packed = torch.randint(0, 256, (n // 2,), generator=torch.Generator().manual_seed(12),
                           dtype=torch.uint8)
    out, clamped = build(fp4_decode, n, out_idx=[1, 2], target=target)(packed)
    nibbles = torch.stack([packed & 15, packed >> 4], 1).reshape(-1).tolist()
    want = [(-1 if v & 8 else 1) * E2M1[v & 7] for v in nibbles]
    assert torch.equal(out, torch.tensor(want, dtype=torch.float16))
    assert torch.equal(clamped, packed.long().clamp(max=100).repeat_interleave(2).int())


def test_tvm_imports_and_unknown_names():
    from tilews import tvm
    from tilews.tvm.tirx import Select
    assert tvm.tirx.Select is Select and tvm.DataType is T.dtype
    with pytest.raises(UnprovidedTVMName, match=r"tilews does not provide TVM's tvm\.te"):
        tvm.te
    assert not hasattr(tirx, "call_extern")


def element_op(n, op, src, dst):
    @T.prim_func
    def main(A: T.Tensor((n,), src), B: T.Tensor((n,), dst)):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(n):
                B[i] = op(A[i])  # <- error
    return main


BAD_ELEMENT_OPS = {
    "reinterpret_to_another_width": (lambda x: T.reinterpret(x, T.uint16), T.float32, T.uint16,
                                     "float32 (32 bits) cannot be reinterpreted as uint16 (16 bits)"),
    "unknown_tirx_name": (lambda x: tirx.bitwise_and(x, 3), T.uint32, T.uint32,
                          "tilews does not provide TVM's tvm.tirx.bitwise_and"),
}


@pytest.mark.parametrize("case", sorted(BAD_ELEMENT_OPS))
def test_bad_element_op_fails_at_the_line(case):
    op, src, dst, message = BAD_ELEMENT_OPS[case]
    error_at(element_op, element_op, message, 32, op, src, dst)
