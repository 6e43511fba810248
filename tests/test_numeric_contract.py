"""The numeric contract (docs/design.md) on every CPU-runnable target: interpret, triton (Triton's
CPU interpreter) and metal (its C++ harness). Outputs poisoned; results against float64 torch at
the stated ulp bounds, and bitwise equal across the targets where the contract fixes the result.

Float ``%`` takes the divisor's sign and ``//`` is the floor of the rounded quotient; bfloat16
arithmetic and casts into bfloat16 round to nearest even (on Triton's CPU interpreter too, whose
own bfloat16 is wrong); a Python float constant takes the other operand's type (rounded to it),
as TileLang's does, so ``x_f16 * 0.1`` is ``round(x * round_f16(0.1))``.
"""
from __future__ import annotations

import math

import pytest
import torch

import tilews
import tilews.language as T
from tilews import targets
from tilews.lowering.backend import Machine
from tilews.metal import harness

from .helpers import marked_line, poisoned, randn

TARGETS = ["interpret", "triton",
           pytest.param("metal", marks=pytest.mark.skipif(harness.compiler() is None,
                                                          reason="needs a C++17 compiler"))]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MANTISSA = {torch.float32: (23, -126), torch.float16: (10, -14), torch.bfloat16: (7, -126)}
N = 64


def ulps(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|y - ref| in units in the last place of y's type at ref (float64 ``ref``)."""
    bits, emin = MANTISSA[y.dtype]
    exp = torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** emin))).clamp_min(emin)
    return (y.double() - ref).abs() / torch.exp2(exp - bits)


def run(target, factory, *args):
    tilews.jit(target=target)(factory)(*args)


def divmod_kernel(dtype):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Z: T.Tensor((N,), dtype), M: T.Tensor((N,), dtype),
             D: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                M[i] = X[i] % Z[i]
                D[i] = X[i] // Z[i]
    return main


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", TARGETS)
def test_float_mod_and_floordiv_follow_python(target, dtype):
    """Before: ``%`` took the dividend's sign on triton (-3.5 % 1.5 gave -0.5), ``//`` raised
    Triton's raw InterpreterError there."""
    dt = DTYPES[dtype]
    x = (randn(N, seed=1) * 4).to(dt)
    z = (randn(N, seed=2) + 0.25).to(dt)
    x[:4] = torch.tensor([-3.5, 3.5, -3.5, 7.0])
    z[:4] = torch.tensor([1.5, -1.5, -1.5, 2.0])
    m, d = poisoned(N, dtype=dt), poisoned(N, dtype=dt)
    run(target, divmod_kernel(dtype), x, z, m, d)
    assert m[:4].tolist() == [1.0, -1.0, -0.5, 1.0]      # as Python's
    assert d[:4].tolist() == [-3.0, -3.0, 2.0, 3.0]
    # the remainder is exact, then one rounding where the divisor is added: <= 0.5 ulp of |z|
    ref_m = torch.remainder(x.double(), z.double())
    assert ((m.double() - ref_m).abs() <= z.double().abs() * 2.0 ** -(MANTISSA[dt][0] + 1)).all()
    assert (torch.sign(m) * torch.sign(z) >= 0).all()
    # the floor of the quotient rounded to the type: float64's floor, or one more where that
    # rounding reached the next integer (float16/bfloat16 here; none of these float32 quotients)
    rounded = (x.double() / z.double()).to(dt).double()
    assert torch.equal(d, torch.floor(rounded).to(dt))
    exact = torch.floor(x.double() / z.double())
    off = d.double() != exact
    assert (d.double()[off] - exact[off] == 1).all() and (rounded[off] == d.double()[off]).all()
    assert not off.any() or dt is not torch.float32


def bf16_kernel():
    @T.prim_func
    def main(X: T.Tensor((N,), T.bfloat16), Z: T.Tensor((N,), T.bfloat16),
             W: T.Tensor((N,), T.float32), S: T.Tensor((N,), T.bfloat16),
             Neg: T.Tensor((N,), T.bfloat16), P: T.Tensor((N,), T.bfloat16),
             Q: T.Tensor((N,), T.bfloat16), C: T.Tensor((N,), T.bfloat16)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                S[i] = X[i] + Z[i]
                Neg[i] = -X[i]
                P[i] = X[i] * Z[i]
                Q[i] = X[i] * 2.0
                C[i] = T.cast(W[i], T.bfloat16)
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_bfloat16_arithmetic_and_casts_round_to_nearest_even(target):
    """0 ulp: every result is float64's rounded once to bfloat16 (ties to even). Before, on
    triton: sums near 1e38, wrong negations and products, ``X[i] * 2.0`` a raw InterpreterError,
    casts that truncated (and subnormals lost)."""
    bf = torch.bfloat16
    x, z = randn(N, seed=3).to(bf), randn(N, seed=4).to(bf)
    x[:3] = torch.tensor([1e-39, -3e-40, float("inf")])       # subnormals, infinity
    w = randn(N, seed=5) * 100
    w[:4] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1e-39])   # ties, subnormal
    outs = [poisoned(N, dtype=bf) for _ in range(5)]
    run(target, bf16_kernel(), x, z, w, *outs)
    s, neg, p, q, c = outs
    x64, z64 = x.double(), z.double()
    for got, want in ((s, x64 + z64), (neg, -x64), (p, x64 * z64), (q, x64 * 2.0)):
        assert torch.equal(got, want.float().to(bf)), (got - want.float().to(bf)).abs().max()
    assert torch.equal(c, w.to(bf))
    assert c[:3].tolist() == [1.0, 1 + 2 ** -6, -1.0]


def constant_kernel(dtype):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                Y[i] = X[i] * 0.1
    return main


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float_constant_takes_the_operand_type_on_every_target(dtype):
    """``x * 0.1`` on 16-bit floats is ``round(x * round(0.1))`` bitwise on every target, within
    1.5 ulp of float64's ``x * 0.1`` (half an ulp of the constant's rounding, half of the
    result's). Before: the interpreter rounded once from float32 (26 of 64 float16 elements one
    ulp off the others)."""
    dt = DTYPES[dtype]
    x = (randn(N, seed=6) * 8).to(dt)
    want = (x.double() * torch.tensor(0.1).to(dt).double()).float().to(dt)
    for target in [t if isinstance(t, str) else t.values[0] for t in TARGETS]:
        if target == "metal" and harness.compiler() is None:
            continue
        y = poisoned(N, dtype=dt)
        run(target, constant_kernel(dtype), x, y)
        assert torch.equal(y, want), f"{target}: {int((y != want).sum())} of {N} differ"
    assert (ulps(want, x.double() * 0.1) <= 1.5).all()
    assert math.isclose(float(torch.tensor(0.1).to(dt)), 0.1, rel_tol=2.0 ** -MANTISSA[dt][0])


def test_bfloat16_atomic_add_is_refused_under_the_triton_cpu_interpreter():
    """Triton's CPU interpreter adds bfloat16 bits as integers: a clear error, not a wrong sum."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((1,), T.bfloat16)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                T.atomic_add(Y[0], X[i])  # <- error
    with pytest.raises(tilews.CompileError, match="bfloat16") as info:
        run("triton", main, randn(N, seed=7), torch.zeros(1, dtype=torch.bfloat16))
    line = marked_line(test_bfloat16_atomic_add_is_refused_under_the_triton_cpu_interpreter)
    assert info.value.loc.line == line, str(info.value)


def widening_kernel(dtype, fp8):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Z: T.Tensor((N,), dtype), P: T.Tensor((N,), T.float32),
             M: T.Tensor((N,), T.float32), C: T.Tensor((N,), T.float32),
             Q: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                P[i] = X[i] * Z[i] + X[i]
                M[i] = X[i] % -3
                C[i] = T.cast(T.cast(X[i], fp8), T.float32)
                Q[i] = T.cast(T.cast(X[i], fp8), dtype) * 3
    return main


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("target", TARGETS)
def test_16bit_results_round_to_their_type_before_a_wider_store(target, dtype, fp8):
    """Each 16-bit operation rounds to its type even where the store widens it, and an FP8 value
    cast back is the FP8 number (found by tests/test_fuzz_numeric.py). Before: ``%`` of
    float16/bfloat16 on triton was Triton's float32 remainder, unrounded (Triton computes ``%``
    of 16-bit floats in float32); bfloat16 arithmetic on metal's harness was float32; a cast
    into FP8 and back on metal gave the FP8 byte's integer value."""
    dt, f8 = DTYPES[dtype], getattr(torch, fp8)
    x, z = (randn(N, seed=8) * 3).to(dt), randn(N, seed=9).to(dt)
    outs = [poisoned(N) for _ in range(3)] + [poisoned(N, dtype=dt)]
    run(target, widening_kernel(dtype, fp8), x, z, *outs)
    x64 = x.double()
    want_p = ((x64 * z.double()).float().to(dt).double() + x64).float().to(dt).float()
    want_m = torch.remainder(x64, -3.0).float().to(dt).float()
    want_c = x.to(f8).float()
    for got, want in zip(outs, (want_p, want_m, want_c, (want_c * 3).to(dt))):
        assert torch.equal(got, want), f"{int((got != want).sum())} of {N} differ"


def minmax_constant_kernel(dtype):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Hi: T.Tensor((N,), T.float32),
             Lo: T.Tensor((N,), T.float32)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                Hi[i] = T.max(X[i], 1) + X[i]
                Lo[i] = T.min(X[i], 0.1) + X[i]
    return main


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("target", TARGETS)
def test_16bit_min_max_with_a_constant_keeps_the_type(target, dtype):
    """``T.max(x_f16, 1) + x`` is a float16 sum (found by tests/test_fuzz_numeric.py). Before,
    on triton: Triton's CPU interpreter made the min/max float32, so the sum was not rounded."""
    dt = DTYPES[dtype]
    x = (randn(N, seed=10) * 2).to(dt)
    hi, lo = poisoned(N), poisoned(N)
    run(target, minmax_constant_kernel(dtype), x, hi, lo)
    x64 = x.double()
    one, tenth = torch.tensor(1.0).to(dt).double(), torch.tensor(0.1).to(dt).double()
    assert torch.equal(hi, (torch.maximum(x64, one) + x64).float().to(dt).float())
    assert torch.equal(lo, (torch.minimum(x64, tenth) + x64).float().to(dt).float())


def test_the_gpu_source_rounds_16bit_division_and_bf16_min_to_the_type(monkeypatch):
    """For a GPU (Triton compiles the ``tl`` source), a bfloat16 ``/`` divides in float32 with
    ``div_rn`` (Triton's ``/`` is ``div.full.f32``, up to 2 ulp off, whose rounding to 16 bits
    could differ) and a bfloat16's min (which Triton computes in float32) is rounded back to
    bfloat16 before the sum uses it. Before: ``X / Z`` and a bare ``tl.minimum``."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.bfloat16), Z: T.Tensor((N,), T.bfloat16),
             Q: T.Tensor((N,), T.bfloat16), S: T.Tensor((N,), T.bfloat16)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                Q[i] = X[i] / Z[i]
                S[i] = T.min(X[i], Z[i]) + X[i]
    monkeypatch.setattr(targets, "machine", lambda: Machine(cuda=True, capability=(9, 0), num_sms=132))
    src = tilews.jit(target="triton")(main).get_kernel_source()
    x, z = "tl.load(X + i * X_stride0)", "tl.load(Z + i * Z_stride0)"
    assert f"tl.cast(tl.math.div_rn(tl.cast({x}, tl.float32), tl.cast({z}, tl.float32)), tl.bfloat16)" in src
    assert f"tl.cast(tl.minimum({x}, {z}), tl.bfloat16)" in src
