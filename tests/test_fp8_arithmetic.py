"""FP8 arithmetic on the ``triton`` target on a CPU (docs/design.md, numeric contract): float8
e4m3fn / e5m2 operands and results give the interpreter's bits. Each operation is float32's
exact result rounded once to the type (e4m3fn saturating, e5m2 overflowing to infinity);
comparisons, ``max``/``min`` and negation are exact; reductions and gemms accumulate in float32.

Before, Triton 3.6's CPU interpreter computed on the FP8 bits as integers (sums, products,
negations, comparisons all wrong), raised its raw ``InterpreterError`` for ``X[i] * 2.0`` and
``%``, and widened e5m2 infinity to 65536 (a sum over a row holding it was finite). tilews now
holds FP8 values in float32 there (``StreamPlan.f32_values``), as it does bfloat16; the source for
a GPU is unchanged.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews import targets
from tilews.lowering.backend import Machine

from .helpers import marked_line, poisoned, randn

N = 64
FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
TARGETS = ["interpret", "triton"]


def elementwise(dtype):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Z: T.Tensor((N,), dtype), Fma: T.Tensor((N,), dtype),
             Neg: T.Tensor((N,), dtype), Max: T.Tensor((N,), dtype), Min: T.Tensor((N,), dtype),
             Twice: T.Tensor((N,), dtype), Quot: T.Tensor((N,), dtype),
             Less: T.Tensor((N,), T.int32)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                Fma[i] = X[i] * Z[i] + X[i]
                Neg[i] = -X[i]
                Max[i] = T.max(X[i], Z[i])
                Min[i] = T.min(X[i], Z[i])
                Twice[i] = X[i] * 2.0
                Quot[i] = X[i] / Z[i]
                Less[i] = T.if_then_else(X[i] < Z[i], 1, 0)
    return main


def special(dt: torch.dtype) -> list[float]:
    """The largest finite value, its negation, the least subnormal, zeros, NaN and (e5m2) the
    infinities."""
    info = torch.finfo(dt)
    extra = [float("inf"), float("-inf")] if dt is torch.float8_e5m2 else [info.max * 0.75]
    return [info.max, -info.max, info.smallest_normal * 2 ** -3, -0.0, 0.0, float("nan")] + extra


def same_bits(got: torch.Tensor, want: torch.Tensor, zero_sign: bool = True) -> bool:
    """Equal values, NaN where NaN (its sign aside), and with ``zero_sign`` equal bits."""
    g, w = got.float(), want.float()
    number = ~w.isnan()
    if not torch.equal(g.isnan(), w.isnan()) or not torch.equal(g[number], w[number]):
        return False
    return not zero_sign or torch.equal(got.view(torch.uint8)[number], want.view(torch.uint8)[number])


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("target", TARGETS)
def test_fp8_elementwise_is_float32_rounded_once(target, dtype):
    dt = FP8[dtype]
    x, z = (randn(N, seed=1) * 4).to(dt), (randn(N, seed=2) * 4).to(dt)
    s = torch.tensor(special(dt))
    x[:len(s)], z[len(s):2 * len(s)] = s.to(dt), s.to(dt)
    z[2 * len(s)] = 0.0                                  # x / 0
    outs = [poisoned(N, dtype=dt) for _ in range(6)] + [poisoned(N, dtype=torch.int32)]
    tilews.jit(target=target)(elementwise)(dtype)(x, z, *outs)
    fma, neg, mx, mn, twice, quot, less = outs
    xf, zf = x.float(), z.float()
    want = {"x * z + x": (fma, ((xf * zf).to(dt).float() + xf).to(dt)),
            "-x": (neg, (-xf).to(dt)), "max": (mx, torch.maximum(xf, zf).to(dt)),
            "min": (mn, torch.minimum(xf, zf).to(dt)), "x * 2.0": (twice, (xf * 2.0).to(dt)),
            "x / z": (quot, (xf / zf).to(dt))}
    for name, (got, ref) in want.items():
        # Triton negates as 0 - x, so -(0.0) is 0.0 on triton (every float type, a GPU too)
        assert same_bits(got, ref, zero_sign=name != "-x"), \
            f"{name}: {got.float().tolist()} != {ref.float().tolist()}"
    assert torch.equal(less, (xf < zf).int())


def reductions(dtype, M=16, C=32):
    @T.prim_func
    def main(X: T.Tensor((M, C), dtype), Sum: T.Tensor((M,), dtype), Max: T.Tensor((M,), dtype),
             Sum32: T.Tensor((M,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((M, C), dtype)
            s = T.alloc_fragment((M,), dtype)
            m = T.alloc_fragment((M,), dtype)
            s32 = T.alloc_fragment((M,), T.float32)
            T.copy(X, tile)
            T.reduce_sum(tile, s, dim=1)
            T.reduce_max(tile, m, dim=1)
            T.reduce_sum(tile, s32, dim=1)
            T.copy(s, Sum)
            T.copy(m, Max)
            T.copy(s32, Sum32)
    return main


def exact_fp8(shape, dt, seed, low=2.0 ** -4, high=64.0) -> torch.Tensor:
    """Random FP8 values of magnitude in [low, high], whose sums (of few terms) float32 holds
    exactly, so that the order of accumulation cannot change them."""
    x = randn(*shape, seed=seed) * 4
    return (torch.sign(x) * x.abs().clamp(low, high)).to(dt)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("target", TARGETS)
def test_fp8_reductions_accumulate_in_float32(target, dtype):
    dt = FP8[dtype]
    x = exact_fp8((16, 32), dt, seed=3)
    top = torch.finfo(dt).max
    x[0, 3] = float("inf") if dt is torch.float8_e5m2 else top        # e5m2's infinity
    x[1, :] = -top                                                    # a sum beyond the type
    outs = [poisoned(16, dtype=dt), poisoned(16, dtype=dt), poisoned(16)]
    tilews.jit(target=target)(reductions)(dtype)(x, *outs)
    sums, maxes, sums32 = outs
    ref = x.double().sum(dim=1)
    assert torch.equal(sums32, ref.float()), (sums32 - ref.float()).abs().max()
    assert same_bits(sums, ref.float().to(dt))
    assert same_bits(maxes, x.float().amax(dim=1).to(dt))


def gemm(dtype, M=16, N_=16, K=32):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N_), dtype), C: T.Tensor((M, N_), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_shared((M, K), dtype)
            b = T.alloc_shared((K, N_), dtype)
            c = T.alloc_fragment((M, N_), T.float32)
            T.copy(A, a)
            T.copy(B, b)
            T.clear(c)
            T.gemm(a, b, c)
            T.copy(c, C)
    return main


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("target", TARGETS)
def test_fp8_gemm_operands(target, dtype):
    dt = FP8[dtype]
    a = exact_fp8((16, 32), dt, seed=4, low=0.25, high=8.0)
    b = exact_fp8((32, 16), dt, seed=5, low=0.25, high=8.0)
    a[0, 5] = float("inf") if dt is torch.float8_e5m2 else torch.finfo(dt).max
    c = poisoned(16, 16)
    tilews.jit(target=target)(gemm)(dtype)(a, b, c)
    assert torch.equal(c, (a.double() @ b.double()).float())


def test_the_gpu_source_computes_in_fp8(monkeypatch):
    """The float32 holding is the CPU interpreter's alone: for a GPU the same program loads,
    computes and stores FP8 tensors as Triton does (no bit conversions), as before."""
    def source(machine):
        monkeypatch.setattr(targets, "machine", lambda: machine)
        return tilews.jit(target="triton")(elementwise)("float8_e5m2").get_kernel_source()
    gpu, cpu = source(Machine(cuda=True, capability=(9, 0), num_sms=132)), source(Machine())
    assert "bitcast=True" not in gpu and "tl.float32" not in gpu
    load = "tl.load({0} + i * {0}_stride0)".format
    assert f"tl.store(Fma + i * Fma_stride0, (({load('X')} * {load('Z')}) + {load('X')}))" in gpu
    assert "bitcast=True" in cpu


def test_fp8_atomic_add_is_refused_under_the_triton_cpu_interpreter():
    """Triton's CPU interpreter adds FP8 bits as integers: a clear error, not a wrong sum."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((1,), T.float8_e4m3fn)):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(N):
                T.atomic_add(Y[0], X[i])  # <- error
    with pytest.raises(tilews.CompileError, match="float8_e4m3fn") as info:
        tilews.jit(target="triton")(main)(randn(N, seed=6), torch.zeros(1, dtype=torch.float8_e4m3fn))
    line = marked_line(test_fp8_atomic_add_is_refused_under_the_triton_cpu_interpreter)
    assert info.value.loc.line == line, str(info.value)
