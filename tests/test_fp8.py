"""FP8 scaled matmul (docs/fp8.md): ``T.fp8_scaled_matmul`` (whole-GEMM and tile forms),
``tilews.lowering.fp8.granularity``, ``tilews.ops.fp8_scaled_mm``, and ``T.macro`` (which the
intrinsic is built from).

* ``granularity``: every accepted pair of scale shapes, the overlaps (K <= 128: [M, 1] is a row
  scale and a one-block scale; N == 1: [1, N] is a column scale and a tensor scale) and the
  ``ValueError`` listing the accepted shapes.
* Whole GEMM vs float64 (block scales expanded to elements) on the interpreter (every granularity
  x FP8 dtype pair x B layout, each over all out dtypes x ``use_fast_accum``, ragged M / N / K)
  and on Triton's CPU interpreter (a subset covering each of those values). C is passed in,
  poisoned with NaN. Tolerances (relative Frobenius error vs float64):

  - float32 out: 1e-5. Products of two FP8 values are exact in float32 (at most 4 x 4 significant
    bits; exponents within 2^-32 .. 2^32), so the only errors are float32 roundings of the K-long
    sums and of the 2-3 scale multiplications (each <= 2^-24 relative): at most ~5e-8 is measured
    for K <= 300, and the interpreter matrix asserts < 1e-6 as well.
  - float16 out: 2e-3. One rounding to 11 significant bits (unit roundoff 2^-11 ~ 4.9e-4 per
    element; ~2e-4 Frobenius measured). Scales stay in [0.5, 1.5) so |C| stays far below 65504.
  - bfloat16 out: 1e-2. One rounding to 8 significant bits (2^-9 ~ 2e-3 per element; ~1.7e-3
    Frobenius measured with tilews' round-to-nearest; on Triton's CPU interpreter tilews rounds
    bfloat16 itself, to nearest even, docs/design.md "Numeric contract").

  0-dim ([]) scales: the one element is read without a mask on the triton and Gluon backends
  (an empty ``mask=`` was a SyntaxError in the generated source).
* Hypothesis: shapes, granularity and scales from 1e-20 to 1e20 (each factor; their product kept
  within 1e+-20 so float32 C cannot overflow) with float32 C on the interpreter: relative
  error <= 1e-5 and no NaN / inf.
* Tile form: a user's own block-scaled GEMM (``T.Pipelined``, per-row and per-column scale
  fragments per k-tile) and one with a scalar value and a one-element scale buffer.
* Errors, at build time, of the right type, naming the operand, located at the user's call.
  ``tilews.ops.fp8_scaled_mm``'s errors too.
* ``tilews.ops.fp8_scaled_mm`` on the CPU against float64 torch (torch._scaled_mm conventions).
* Hopper: the interpreter as the oracle of the lowering (before == after under 20 random
  schedules, warp-specialized with an ``AsyncPlan``), the ``AsyncRefusal`` for an N-major B,
  and compile-only sm_90a checks of the PTX / TTGIR (FP8 wgmma, TMA, warp_specialize, the FP8
  verifier's promotion rule).
* ``T.macro``: inlining with different arguments, return values, nesting, runtime loops and
  branches, the early-return error and error locations inside a macro.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilews
import tilews.language as T
import tilews.language.fp8 as fp8_language
from tilews import CompileError
from tilews.errors import CompileTypeError, CompileValueError
from tilews.lowering import interpreter, ir, verify_async
from tilews.lowering.fp8 import SCALE_BLOCK, Granularity, Scaling, accepted, granularity
from tilews.lowering.frontend import Macro, build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, AsyncRefusal, SharedMemoryPlan
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.simplify import evaluate
from tilews.lowering.traverse import exprs_of, subexprs, transform, walk
from tilews import ops
from tilews.ops import fp8_scaled_mm
from tilews.ops import fp8 as fp8_ops
from tilews.ops.fp8 import kernel_inputs
from tilews.triton_ext.gluon import emit as gluon_emit
from tilews.triton_ext.passes.fp8_verifier import verify_fp8
from tilews.triton_ext.toolchain import ptxas_report

from .helpers import (gluon_program, load, marked_line, poisoned, rel_err, roles, tuned_entries,
                      unwaited_global_accesses)
from .test_ws_oracle import run_interp

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_T = {E4M3: T.float8_e4m3, E5M2: T.float8_e5m2, torch.bfloat16: T.bfloat16,
      torch.float16: T.float16, torch.float32: T.float32}
PAIRS = {"e4m3-e4m3": (E4M3, E4M3), "e5m2-e5m2": (E5M2, E5M2), "e4m3-e5m2": (E4M3, E5M2)}
OUTS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def cdiv(a, b):
    return -(-a // b)


# ----------------------------------------------------------------------------------------------
# kernels, inputs, references


# Hopper's widest whole-GEMM tiles (two consumer warp groups, two 128-column parts when
# promoting), which the tests of that form's structure pin: the tile choice depends on the shape
WIDE = dict(block_M=128, block_N=256, num_stages=3, threads=256)


def scaled_gemm(M, N, K, sa_shape, sb_shape, transpose_B, fast, a_dtype, b_dtype, out_dtype,
                sa_dtype=T.float32, sb_dtype=T.float32, c_shape=None, b_shape=None, sa_t=False,
                **hints):
    """The whole-GEMM form (with tile ``hints``); C is a parameter (no out_idx: the test passes
    a poisoned C)."""
    b_shape = b_shape or ((N, K) if transpose_B else (K, N))

    @T.prim_func
    def main(A: T.Tensor((M, K), a_dtype), A_scale: T.Tensor(sa_shape, sa_dtype),
             B: T.Tensor(b_shape, b_dtype), B_scale: T.Tensor(sb_shape, sb_dtype),
             C: T.Tensor(c_shape or (M, N), out_dtype)):
        T.fp8_scaled_matmul(A, A_scale, B, B_scale, C, transpose_B=transpose_B,  # <- the call
                            use_fast_accum=fast, transpose_A_scale=sa_t, **hints)
    return main


def fp8(shape, dtype, seed, scale=4.0):
    """Random normal times ``scale``, pushed 0.125 away from zero (no element becomes 0), in FP8."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(shape), generator=g) * scale
    q = (x + torch.where(x < 0, -0.125, 0.125)).to(dtype)
    assert (q.float() != 0).all() and q.float().isfinite().all()
    return q


def positive(shape, seed, lo=0.5, hi=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(tuple(shape), generator=g) * (hi - lo) + lo


def expand_blocks(sa, sb_nk, M, N, K):
    """Block scales (intrinsic orientation: sb [ceil(N/128), ceil(K/128)]) per element: [M, K]
    for A and [N, K] for B."""
    sae = sa.double().repeat_interleave(SCALE_BLOCK, 1)[:, :K]
    sbe = sb_nk.double().repeat_interleave(SCALE_BLOCK, 0)[:N].repeat_interleave(SCALE_BLOCK, 1)[:, :K]
    assert sae.shape == (M, K) and sbe.shape == (N, K)
    return sae, sbe


def reference(a, sa, b_nk, sb, block):
    """float64 scaled (A @ B^T) for B given as [N, K]; ``block``: sb is [ceil(N/128), ceil(K/128)]."""
    A, B = a.double(), b_nk.double()
    (M, K), N = A.shape, B.shape[0]
    if block:
        sae, sbe = expand_blocks(sa, sb, M, N, K)
        return (A * sae) @ (B * sbe).t()
    return (A @ B.t()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)


# granularity cases: name -> (A_scale shape, B_scale shape) for M, N, K
GRANS = {
    "tensor-0d": lambda M, N, K: ((), ()),
    "tensor-1": lambda M, N, K: ((1,), (1,)),
    "row-1d": lambda M, N, K: ((M,), (N,)),
    "row-2d": lambda M, N, K: ((M, 1), (1, N)),
    "row-x-tensor-0d": lambda M, N, K: ((M, 1), ()),
    "row-x-tensor-1": lambda M, N, K: ((M,), (1,)),
    "tensor-x-col": lambda M, N, K: ((1,), (N,)),
    "block": lambda M, N, K: ((M, cdiv(K, 128)), (cdiv(N, 128), cdiv(K, 128))),
    # block-wise with A's scales k-block-major (transpose_A_scale=True): A_scale [ceil(K/128), M]
    "block-t": lambda M, N, K: ((cdiv(K, 128), M), (cdiv(N, 128), cdiv(K, 128))),
}


def scale_kwargs(gran) -> dict:
    return dict(sa_t=gran == "block-t")


def a_scale_as_given(gran, sa):
    """A's scales [M, ceil(K/128)] as the reference reads them (``block-t`` gives their transpose)."""
    return sa.t() if gran == "block-t" else sa


def run_gemm(target, M, N, K, gran, pair, transpose_B, out, fast, seed=0, scales=None):
    """Launch the whole-GEMM form on ``target`` with C poisoned; returns (C, float64 reference)."""
    a_dt, b_dt = pair
    sas, sbs = GRANS[gran](M, N, K)
    a = fp8((M, K), a_dt, seed)
    b_nk = fp8((N, K), b_dt, seed + 1)
    sa, sb = scales if scales is not None else (positive(sas, seed + 2), positive(sbs, seed + 3))
    factory = tilews.jit(target=target)(scaled_gemm)
    k = factory(M, N, K, sas, sbs, transpose_B, fast, _T[a_dt], _T[b_dt], _T[out], **scale_kwargs(gran))
    c = poisoned(M, N, dtype=out)
    k(a, sa, b_nk if transpose_B else b_nk.t().contiguous(), sb, c)
    return c, reference(a, a_scale_as_given(gran, sa), b_nk, sb, gran.startswith("block"))


# ----------------------------------------------------------------------------------------------
# 1. granularity


M0, N0, K0 = 100, 136, 300          # kb = 3, nb = 2
TENSOR, ROW, BLOCK = Scaling.TENSOR, Scaling.ROW, Scaling.BLOCK


@pytest.mark.parametrize("sa, sb, want", [
    ((), (), (TENSOR, TENSOR)),
    ((1,), (1,), (TENSOR, TENSOR)),
    ((), (1,), (TENSOR, TENSOR)),
    ((1,), (), (TENSOR, TENSOR)),
    ((M0,), (N0,), (ROW, ROW)),
    ((M0, 1), (1, N0), (ROW, ROW)),
    ((M0,), (1, N0), (ROW, ROW)),
    ((M0, 1), (N0,), (ROW, ROW)),
    ((M0,), (), (ROW, TENSOR)),             # row x tensor
    ((M0, 1), (1,), (ROW, TENSOR)),
    ((), (1, N0), (TENSOR, ROW)),           # tensor x column
    ((1,), (N0,), (TENSOR, ROW)),
    ((M0, 3), (2, 3), (BLOCK, BLOCK)),
])
def test_granularity_accepted(sa, sb, want):
    g = granularity(M0, N0, K0, sa, sb)
    assert g == Granularity(*want)
    assert g.block_wise == (want[0] is BLOCK)


def test_granularity_block_shapes_follow_ceil():
    assert granularity(1, 1, 1, (1, 1), (1, 1)) == Granularity(TENSOR, TENSOR)   # all readings agree
    assert granularity(64, 129, 129, (64, 2), (2, 2)) == Granularity(BLOCK, BLOCK)
    assert granularity(64, 128, 128, (64, 1), (1, 1)) == Granularity(BLOCK, BLOCK)
    assert granularity(64, 256, 513, (64, 5), (2, 5)) == Granularity(BLOCK, BLOCK)
    # M == 1: a [1] / [1, 1] A_scale is per tensor
    assert granularity(1, 64, 300, (1, 1), (64,)) == Granularity(TENSOR, ROW)


def test_granularity_overlaps():
    # K <= 128 (one k-block): A_scale [M, 1] is a row scale and a one-block scale
    assert granularity(100, 96, 128, (100, 1), (1, 96)) == Granularity(ROW, ROW)
    assert granularity(100, 96, 128, (100, 1), (1, 1)) == Granularity(BLOCK, BLOCK)   # nb = kb = 1
    assert granularity(100, 200, 100, (100, 1), (2, 1)) == Granularity(BLOCK, BLOCK)
    # N == 1: B_scale [1, 1] is a column scale, a tensor scale and (K <= 128) a one-block scale
    assert granularity(100, 1, 100, (100, 1), (1, 1)) == Granularity(ROW, TENSOR)
    assert granularity(100, 1, 100, (100,), (1,)) == Granularity(ROW, TENSOR)
    # with K > 128 the block reading needs kb columns: [M, 1] stays a row scale
    assert granularity(100, 1, 300, (100, 1), (1, 1)) == Granularity(ROW, TENSOR)
    assert granularity(100, 1, 300, (100, 3), (1, 3)) == Granularity(BLOCK, BLOCK)


@pytest.mark.parametrize("overlap", ["k-le-128", "n-eq-1"])
def test_granularity_overlaps_mean_the_same_numbers(overlap):
    """Both readings of an overlapping pair of shapes give the same result."""
    M, N, K = (100, 96, 100) if overlap == "k-le-128" else (100, 1, 100)
    a, b_nk = fp8((M, K), E4M3, 31), fp8((N, K), E4M3, 32)
    sa, sb = positive((M, 1), 33), positive((1, 1), 34)
    sas, sbs = (M, 1), (1, 1)
    g = granularity(M, N, K, sas, sbs)
    assert g == (Granularity(BLOCK, BLOCK) if overlap == "k-le-128" else Granularity(ROW, TENSOR))
    k_block = tilews.jit(target="interpret")(scaled_gemm)(M, N, K, sas, sbs, True, False, T.float8_e4m3,
                                                          T.float8_e4m3, T.float32)
    k_outer = tilews.jit(target="interpret")(scaled_gemm)(M, N, K, (M,), (1,), True, False,
                                                          T.float8_e4m3, T.float8_e4m3, T.float32)
    c1, c2 = poisoned(M, N), poisoned(M, N)
    k_block(a, sa, b_nk, sb, c1)
    k_outer(a, sa.reshape(M), b_nk, sb.reshape(1), c2)
    assert rel_err(c1, c2) < 1e-6
    assert rel_err(c1, reference(a, sa, b_nk, sb, block=True)) < 1e-5
    assert rel_err(c1, reference(a, sa, b_nk, sb, block=False)) < 1e-5


@pytest.mark.parametrize("sa, sb", [
    ((M0, 2), (2, 3)),          # too few k-blocks
    ((M0, 3), (3, 2)),          # torch's [kb, nb] orientation given to the intrinsic
    ((N0,), (M0,)),             # swapped
    ((1, M0), (N0,)),           # A_scale as a row vector
    ((M0,), (N0, 1)),           # B_scale as a column vector
    ((M0, 1, 1), ()),
    ((M0, 3), (N0,)),           # block x column
    ((2,), (1,)),
])
def test_granularity_rejects_with_the_accepted_shapes(sa, sb):
    with pytest.raises(ValueError) as e:
        granularity(M0, N0, K0, sa, sb)
    msg = str(e.value)
    assert f"A_scale {list(sa)} and B_scale {list(sb)}" in msg
    assert f"M={M0}, N={N0}, K={K0}" in msg
    assert accepted(M0, N0, K0) in msg
    for shape in ("[100]", "[100, 1]", "[136]", "[1, 136]", "[100, 3]", "[2, 3]", "[] or [1]"):
        assert shape in msg


# ----------------------------------------------------------------------------------------------
# 2. the whole GEMM vs float64


SHAPES = [(100, 136, 300), (70, 200, 129), (129, 72, 257), (96, 100, 100)]   # ragged w.r.t. 64 / 128
MATRIX = [(g, p, tb) for g in GRANS for p in PAIRS for tb in (True, False)]


@pytest.mark.parametrize("gran, pair, transpose_B", MATRIX,
                         ids=[f"{g}-{p}-{'NK' if tb else 'KN'}" for g, p, tb in MATRIX])
def test_whole_gemm_interpreter(gran, pair, transpose_B):
    i = MATRIX.index((gran, pair, transpose_B))
    M, N, K = SHAPES[(i + i // 2) % len(SHAPES)]      # both layouts see every shape
    for out in OUTS.values():
        for fast in (False, True):
            c, ref = run_gemm("interpret", M, N, K, gran, PAIRS[pair], transpose_B, out, fast, seed=i)
            assert c.isfinite().all()
            err = rel_err(c, ref)
            assert err < TOL[out], f"{out} fast={fast}: {err}"
            if out is torch.float32:
                assert err < 1e-6          # measured <= 5e-8: exact products, float32 sums


# (granularity, pair, transpose_B, out, fast, shape): every granularity, pair, layout, out dtype
# and fast flag at least once on Triton's CPU interpreter
TRITON_CASES = [
    ("tensor-0d", "e4m3-e4m3", True, "bf16", False, 0),
    ("tensor-1", "e5m2-e5m2", False, "fp32", True, 1),
    ("row-1d", "e4m3-e5m2", True, "fp16", True, 2),
    ("row-2d", "e4m3-e4m3", False, "fp32", False, 3),
    ("row-x-tensor-0d", "e5m2-e5m2", True, "bf16", False, 0),
    ("row-x-tensor-1", "e5m2-e5m2", True, "bf16", False, 0),
    ("tensor-x-col", "e4m3-e5m2", False, "bf16", True, 1),
    ("block", "e4m3-e4m3", True, "fp32", False, 2),
    ("block", "e4m3-e5m2", False, "bf16", True, 0),
    ("block", "e5m2-e5m2", True, "fp16", False, 1),
    ("block-t", "e4m3-e5m2", True, "bf16", False, 0),
    ("block-t", "e5m2-e5m2", False, "fp32", True, 2),
]


@pytest.mark.parametrize("gran, pair, transpose_B, out, fast, shape", [
    pytest.param(*c, id=f"{c[0]}-{c[1]}-{'NK' if c[2] else 'KN'}-{c[3]}-fast{int(c[4])}")
    for c in TRITON_CASES])
def test_whole_gemm_triton(gran, pair, transpose_B, out, fast, shape):
    M, N, K = SHAPES[shape]
    c, ref = run_gemm("triton", M, N, K, gran, PAIRS[pair], transpose_B, OUTS[out], fast, seed=shape + 40)
    assert c.isfinite().all()
    assert rel_err(c, ref) < TOL[OUTS[out]]


@pytest.mark.parametrize("target", ["interpret", "triton"])
@pytest.mark.parametrize("block_M, block_N, panel", [(32, 32, 0), (64, 256, 0), (32, 64, 2)])
def test_whole_gemm_hints_never_change_results(block_M, block_N, panel, target):
    """256 columns: B's block scales per column; panel 2: tiles visited in panels of 2 rows."""
    M, N, K = 100, 300, 300
    sas, sbs = GRANS["block"](M, N, K)

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float8_e4m3), A_scale: T.Tensor(sas, T.float32),
             B: T.Tensor((N, K), T.float8_e4m3), B_scale: T.Tensor(sbs, T.float32),
             C: T.Tensor((M, N), T.float32)):
        T.fp8_scaled_matmul(A, A_scale, B, B_scale, C, transpose_B=True, block_M=block_M,
                            block_N=block_N, num_stages=1, threads=128, panel=panel)
    k = tilews.jit(target=target)(main)
    assert build_kernel(main).swizzle_panel == panel
    a, b = fp8((M, K), E4M3, 5), fp8((N, K), E4M3, 6)
    sa, sb = positive(sas, 7), positive(sbs, 8)
    c = poisoned(M, N)
    k(a, sa, b, sb, c)
    want, ref = run_gemm(target, M, N, K, "block", (E4M3, E4M3), True, torch.float32, False,
                         seed=5, scales=(sa, sb))
    assert torch.equal(c, want)           # the same k-blocks, summed in the same order
    assert rel_err(c, ref) < 1e-6


def scaled_gemm_with_bias(M, N, K, sa_shape, sb_shape, bias_shape, bias_dtype, out_dtype, sa_t=False):
    """The whole-GEMM form, B [N, K], with a bias; C is a parameter."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float8_e4m3), A_scale: T.Tensor(sa_shape, T.float32),
             B: T.Tensor((N, K), T.float8_e4m3), B_scale: T.Tensor(sb_shape, T.float32),
             Bias: T.Tensor(bias_shape, bias_dtype), C: T.Tensor((M, N), out_dtype)):
        T.fp8_scaled_matmul(A, A_scale, B, B_scale, C, bias=Bias,  # <- the bias call
                            transpose_B=True, transpose_A_scale=sa_t)
    return main


@pytest.mark.parametrize("target", ["interpret", "triton"])
@pytest.mark.parametrize("gran, bias_dtype, out", [
    ("tensor-1", torch.bfloat16, torch.bfloat16), ("row-2d", torch.float32, torch.float16),
    ("block", torch.float16, torch.float32), ("block-t", torch.bfloat16, torch.bfloat16)])
def test_whole_gemm_adds_the_bias_in_the_epilogue(target, gran, bias_dtype, out):
    """C = scaled product + bias[column], rounded once; N = 136 leaves a ragged last tile."""
    M, N, K = 100, 136, 300
    sas, sbs = GRANS[gran](M, N, K)
    prim = scaled_gemm_with_bias(M, N, K, sas, sbs, (N,), _T[bias_dtype], _T[out], sa_t=gran == "block-t")
    a, b = fp8((M, K), E4M3, 11), fp8((N, K), E4M3, 12)
    sa, sb = positive(sas, 13), positive(sbs, 14)
    bias = (torch.randn(N, generator=torch.Generator().manual_seed(15)) * 20).to(bias_dtype)
    c = poisoned(M, N, dtype=out)
    tilews.jit(target=target)(prim)(a, sa, b, sb, bias, c)
    want = reference(a, a_scale_as_given(gran, sa), b, sb, gran.startswith("block")) + bias.double()
    assert c.isfinite().all()
    assert rel_err(c, want) < TOL[out]


BIAS_LINE = marked_line(scaled_gemm_with_bias, "# <- the bias call")


@pytest.mark.parametrize("bias_shape, bias_dtype, exc, fragment", [
    ((137,), T.bfloat16, CompileValueError, "bias is [137], not [N] = [136]"),
    ((1, 136), T.float32, CompileValueError, "bias is [1, 136], not [N] = [136]"),
    ((136,), T.int32, CompileTypeError, "bias is i32; a bias must be bfloat16, float16 or float32"),
])
def test_whole_gemm_bias_errors(bias_shape, bias_dtype, exc, fragment):
    M, N, K = 100, 136, 300
    prim = scaled_gemm_with_bias(M, N, K, (M, 1), (1, N), bias_shape, bias_dtype, T.bfloat16)
    expect_error(exc, prim, BIAS_LINE, fragment)


# ----------------------------------------------------------------------------------------------
# 3. properties: tiny to huge scales, float32 C


@st.composite
def scale_cases(draw):
    M, N, K = draw(st.integers(1, 150)), draw(st.integers(1, 150)), draw(st.integers(1, 300))
    gran = draw(st.sampled_from(sorted(GRANS)))
    ea = draw(st.integers(-20, 20))
    eb = draw(st.integers(max(-20, -20 - ea), min(20, 20 - ea)))     # |ea + eb| <= 20
    return dict(M=M, N=N, K=K, gran=gran, ea=ea, eb=eb, pair=draw(st.sampled_from(sorted(PAIRS))),
                transpose_B=draw(st.booleans()), fast=draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


def spread(shape, exponent, seed):
    """Positive scales around 10**exponent, each within a factor of 10 of it."""
    g = torch.Generator().manual_seed(seed)
    return (10.0 ** (exponent + torch.rand(tuple(shape), generator=g, dtype=torch.float64) * 2 - 1)).float()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scale_cases())
def test_scale_magnitudes_interpreter(case):
    M, N, K, gran = case["M"], case["N"], case["K"], case["gran"]
    sas, sbs = GRANS[gran](M, N, K)
    sa, sb = spread(sas, case["ea"], case["seed"]), spread(sbs, case["eb"], case["seed"] + 1)
    c, ref = run_gemm("interpret", M, N, K, gran, PAIRS[case["pair"]], case["transpose_B"],
                      torch.float32, case["fast"], seed=case["seed"], scales=(sa, sb))
    assert ref.isfinite().all() and ref.abs().max() < 1e30
    assert c.isfinite().all(), case
    assert rel_err(c, ref) < 1e-5, case


# ----------------------------------------------------------------------------------------------
# 4. the tile form: users' own FP8 kernels


def tile_scaled_gemm(M, N, K, bm=64, bn=64, bk=64, stages=2, a_dtype=T.float8_e4m3,
                     b_dtype=T.float8_e5m2):
    """A block-scaled GEMM of its own granularity: per row of A and per column of B, one scale per
    ``bk``-wide k-tile (SA [M, K/bk], SB [N, K/bk]); B as [N, K]."""
    KT = cdiv(K, bk)

    @T.prim_func
    def main(A: T.Tensor((M, K), a_dtype), SA: T.Tensor((M, KT), T.float32),
             B: T.Tensor((N, K), b_dtype), SB: T.Tensor((N, KT), T.float32),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), a_dtype)
            B_s = T.alloc_shared((bn, bk), b_dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            sa = T.alloc_fragment((bm,), T.float32)
            sb = T.alloc_fragment((bn,), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[bx * bn, k * bk], B_s)
                for i in T.Parallel(bm):
                    sa[i] = SA[by * bm + i, k]
                for j in T.Parallel(bn):
                    sb[j] = SB[bx * bn + j, k]
                T.fp8_scaled_matmul(A_s, sa, B_s, sb, C_f, transpose_B=True)
            T.copy(C_f, C[by * bm, bx * bn])
    return main


def tile_scalar_scaled(M, N, K, b_scale, bm=64, bn=64, bk=128):
    """Per-k-tile scalar scales of A (a value read from SK) and a B scale that is a one-element
    fragment (``b_scale="buffer"``) or a Python number; B as [K, N]; bfloat16 C."""
    KT = cdiv(K, bk)

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float8_e4m3), SK: T.Tensor((KT,), T.float32),
             B: T.Tensor((K, N), T.float8_e4m3), SB: T.Tensor((1,), T.float32),
             C: T.Tensor((M, N), T.bfloat16)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float8_e4m3)
            B_s = T.alloc_shared((bk, bn), T.float8_e4m3)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            sb = T.alloc_fragment((1,), T.float32)
            T.clear(C_f)
            for i in T.Parallel(1):
                sb[i] = SB[i]
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                if b_scale == "buffer":
                    T.fp8_scaled_matmul(A_s, SK[k], B_s, sb, C_f)
                else:
                    T.fp8_scaled_matmul(A_s, SK[k], B_s, 0.75, C_f)
            T.copy(C_f, C[by * bm, bx * bn])
    return main


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_tile_form_own_block_scaled_gemm(target):
    M, N, K, bk = 100, 136, 200, 64          # 4 k-tiles, the last one 8 wide
    KT = cdiv(K, bk)
    a, b = fp8((M, K), E4M3, 61), fp8((N, K), E5M2, 62)
    sa, sb = positive((M, KT), 63, 0.25, 4.0), positive((N, KT), 64, 0.25, 4.0)
    k = tilews.jit(target=target)(tile_scaled_gemm)(M, N, K, bk=bk)
    c = poisoned(M, N)
    k(a, sa, b, sb, c)
    sae = sa.double().repeat_interleave(bk, 1)[:, :K]
    sbe = sb.double().repeat_interleave(bk, 1)[:, :K]
    ref = (a.double() * sae) @ (b.double() * sbe).t()
    assert rel_err(c, ref) < 1e-5
    # the per-k-tile scales matter: without them the result is far off
    assert rel_err(c, a.double() @ b.double().t()) > 0.1


@pytest.mark.parametrize("gran, fast, want", [("block", True, 128), ("block", False, 128),
                                               ("row-1d", False, 128), ("row-1d", True, 0),
                                               ("tensor-1", True, 0)])
def test_fp8_promote_every(gran, fast, want):
    M, N, K = 100, 136, 300
    sas, sbs = GRANS[gran](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, fast, T.float8_e4m3, T.float8_e4m3, T.bfloat16)
    assert build_kernel(prim, target="interpret").fp8_promote_every == want
    assert build_kernel(prim, target="hopper").fp8_promote_every == want


def test_tile_form_promotes_every_128():
    assert build_kernel(tile_scaled_gemm(100, 136, 200)).fp8_promote_every == 128


@pytest.mark.parametrize("b_scale", ["buffer", "python"])
@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_tile_form_scalar_scales(target, b_scale):
    M, N, K = 70, 72, 300                     # k-tiles of 128: 3, the last 44 wide
    KT = cdiv(K, 128)
    a, b = fp8((M, K), E4M3, 71), fp8((K, N), E4M3, 72)
    sk, sb = positive((KT,), 73, 0.25, 4.0), positive((1,), 74)
    k = tilews.jit(target=target)(tile_scalar_scaled)(M, N, K, b_scale)
    c = poisoned(M, N, dtype=torch.bfloat16)
    k(a, sk, b, sb, c)
    b_factor = sb.double() if b_scale == "buffer" else 0.75
    ref = (a.double() * sk.double().repeat_interleave(128)[:K]) @ b.double() * b_factor
    assert rel_err(c, ref) < TOL[torch.bfloat16]


# ----------------------------------------------------------------------------------------------
# 5. errors


def expect_error(exc_type, prim, line, *fragments):
    with pytest.raises(exc_type) as info:
        build_kernel(prim, target="interpret")
    e = info.value
    assert isinstance(e, CompileError)
    for f in fragments:
        assert f in e.message, e.message
    assert e.loc is not None and e.loc.file == __file__ and e.loc.line == line, str(e)
    return e


CALL_LINE = marked_line(scaled_gemm, "# <- the call")
F8, F16, F32 = T.float8_e4m3, T.float16, T.float32


@pytest.mark.parametrize("what, exc, kwargs, fragments", [
    ("A float16", TypeError, dict(a_dtype=F16), ["A is f16", "float8_e4m3fn or float8_e5m2"]),
    ("A int8", TypeError, dict(a_dtype=T.int8), ["A is i8"]),
    ("B float16", TypeError, dict(b_dtype=F16), ["B is f16"]),
    ("A_scale float16", TypeError, dict(sa_dtype=F16), ["A_scale is f16", "scales must be float32"]),
    ("B_scale float16", TypeError, dict(sb_dtype=F16), ["B_scale is f16", "scales must be float32"]),
    ("C int8", TypeError, dict(out_dtype=T.int8), ["C is i8"]),
    ("bad scale shapes", ValueError, dict(sa_shape=(M0, 2)),
     ["A_scale [100, 2]", accepted(M0, N0, K0)]),
    ("torch-orientation block B_scale", ValueError, dict(sa_shape=(M0, 3), sb_shape=(3, 2)),
     ["B_scale [3, 2]", "B_scale [2, 3]"]),
    ("K mismatch [N, K]", ValueError, dict(b_shape=(N0, K0 - 1)), ["K differs", "A is [100, 300]"]),
    ("K mismatch [K, N]", ValueError, dict(transpose_B=False, b_shape=(N0, K0)),
     ["K differs", "transpose_B=True takes [N, K]"]),
    ("C shape", ValueError, dict(c_shape=(M0, N0 + 1)), ["C is [100, 137], not [M, N] = [100, 136]"]),
    ("transposed row scales", ValueError, dict(sa_t=True),
     ["transpose_A_scale=True takes block-wise scales: A_scale [3, 100]", "got A_scale [100]"]),
    ("transposed scales, untransposed shape", ValueError,
     dict(sa_t=True, sa_shape=(M0, 3), sb_shape=(2, 3)), ["A_scale [3, 100]", "got A_scale [100, 3]"]),
])
def test_whole_gemm_errors(what, exc, kwargs, fragments):
    args = dict(M=M0, N=N0, K=K0, sa_shape=(M0,), sb_shape=(N0,), transpose_B=True, fast=False,
                a_dtype=F8, b_dtype=F8, out_dtype=T.bfloat16)
    args.update(kwargs)
    e = expect_error(exc, scaled_gemm(**args), CALL_LINE, *fragments)
    assert isinstance(e, CompileTypeError if exc is TypeError else CompileValueError)


def tile_error_kernel(kind):
    bk = 256 if kind == "k256" else 64
    sa_len = 32 if kind == "short_scale" else 64

    @T.prim_func
    def main(A: T.Tensor((128, 512), T.float8_e4m3), B: T.Tensor((128, 512), T.float8_e4m3),
             S: T.Tensor((64,), T.float32), C: T.Tensor((128, 128), T.float32)):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((64, bk), T.float8_e4m3)
            B_s = T.alloc_shared((64, bk), T.float8_e4m3)
            C_f = T.alloc_fragment((64, 64), T.float32)
            sa = T.alloc_fragment((sa_len,), T.float32 if kind != "f16_scale" else T.float16)
            T.clear(C_f)
            for i in T.Parallel(sa_len):
                sa[i] = 1.0
            T.copy(A[by * 64, 0], A_s)
            T.copy(B[bx * 64, 0], B_s)
            if kind == "global_operand":
                T.fp8_scaled_matmul(A, sa, B_s, 1.0, C_f, transpose_B=True)  # <- global operand
            elif kind == "global_scale":
                T.fp8_scaled_matmul(A_s, S, B_s, 1.0, C_f, transpose_B=True)  # <- global scale
            elif kind == "transposed_scale":
                T.fp8_scaled_matmul(A_s, sa, B_s, 1.0, C_f, transpose_A_scale=True)  # <- transposed scale
            elif kind == "bias":
                T.fp8_scaled_matmul(A_s, sa, B_s, 1.0, C_f, transpose_B=True, bias=S)  # <- tile bias
            else:
                T.fp8_scaled_matmul(A_s, sa, B_s, 1.0, C_f, transpose_B=True)  # <- tile call
            T.copy(C_f, C[by * 64, bx * 64])
    return main


@pytest.mark.parametrize("kind, exc, marker, fragments", [
    ("global_operand", CompileTypeError, "# <- global operand",
     ["A ('A') is in global memory", "without T.Kernel"]),
    ("k256", CompileValueError, "# <- tile call", ["A's k-tile is 256 wide", "at most 128"]),
    ("short_scale", CompileValueError, "# <- tile call", ["A_scale has shape [32]; it must be [64]"]),
    ("f16_scale", CompileTypeError, "# <- tile call", ["A_scale is f16; scales must be float32"]),
    ("global_scale", CompileTypeError, "# <- global scale", ["A_scale is a global tensor"]),
    ("transposed_scale", CompileValueError, "# <- transposed scale",
     ["transpose_A_scale only apply to the whole-GEMM form"]),
    ("bias", CompileValueError, "# <- tile bias", ["bias only apply to the whole-GEMM form"]),
])
def test_tile_form_errors(kind, exc, marker, fragments):
    expect_error(exc, tile_error_kernel(kind), marked_line(tile_error_kernel, marker), *fragments)


class TestOpsErrors:
    M, N, K = 64, 72, 300
    a = fp8((64, 300), E4M3, 1)
    b = fp8((72, 300), E4M3, 2).t()

    def test_non_fp8_a(self):
        with pytest.raises(TypeError, match="'a' is torch.float16"):
            fp8_scaled_mm(self.a.half(), self.b, torch.tensor(1.0), torch.tensor(1.0))

    def test_non_fp8_b(self):
        with pytest.raises(TypeError, match="'b' is torch.bfloat16"):
            fp8_scaled_mm(self.a, self.b.bfloat16(), torch.tensor(1.0), torch.tensor(1.0))

    @pytest.mark.parametrize("which", ["scale_a", "scale_b"])
    def test_float16_scale(self, which):
        s = {"scale_a": torch.tensor(1.0), "scale_b": torch.tensor(1.0)}
        s[which] = s[which].half()
        with pytest.raises(TypeError, match=f"'{which}' must be a float32 tensor, got torch.float16"):
            fp8_scaled_mm(self.a, self.b, **s)

    @pytest.mark.parametrize("sa, sb", [((64, 2), (3, 1)), ((72, 1), (1, 72)), ((64, 3), (1, 3)),
                                        ((1, 64), (1, 72)), ((64, 1), (72, 1))])
    def test_bad_scale_shapes(self, sa, sb):
        with pytest.raises(ValueError) as e:
            fp8_scaled_mm(self.a, self.b, torch.ones(sa), torch.ones(sb))
        msg = str(e.value)
        assert f"scale_a {list(sa)} and scale_b {list(sb)}" in msg
        assert "scale_a [64, 1]" in msg and "scale_b [1, 72]" in msg
        assert "scale_a [64, 3]" in msg and "scale_b [3, 1]" in msg

    def test_k_mismatch(self):
        with pytest.raises(ValueError, match=r"a is \[64, 300\] but b is \[299, 72\]: K differs"):
            fp8_scaled_mm(self.a, self.b[:299], torch.tensor(1.0), torch.tensor(1.0))


# ----------------------------------------------------------------------------------------------
# 6. tilews.ops.fp8_scaled_mm on the CPU


@pytest.fixture
def fresh_fp8_calls(monkeypatch, tmp_path):
    """No cached ``fp8_scaled_mm`` calls or tuned tilings before or after the test; a tuning
    cache in ``tmp_path`` (returned)."""
    monkeypatch.setattr(fp8_ops, "_calls", {})
    monkeypatch.setattr(fp8_ops._winners, "tuned", {})
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TILEWS_TUNE", raising=False)
    return tmp_path


def ops_scales(kind, M, N, K, seed):
    kb, nb = cdiv(K, 128), cdiv(N, 128)
    shapes = {"tensor": ((), ()), "row": ((M, 1), (1, N)), "block": ((M, kb), (kb, nb))}[kind]
    return positive(shapes[0], seed), positive(shapes[1], seed + 1)


def ops_reference(a, b, sa, sb, kind, bias):
    """float64 scaled a @ b for b [K, N]; block scale_b in torch's [K/128, N/128] orientation."""
    (M, K), N = a.shape, b.shape[1]
    if kind == "block":
        sae = sa.double().repeat_interleave(128, 1)[:, :K]
        sbe = sb.double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
        out = (a.double() * sae) @ (b.double() * sbe)
    else:
        out = (a.double() @ b.double()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("out", sorted(OUTS))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["col-major", "row-major"])
@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
def test_ops_fp8_scaled_mm(kind, layout, with_bias, out):
    M, N, K = 100, 136, 300
    out_dtype = OUTS[out]
    a = fp8((M, K), E4M3, 81)
    w = fp8((N, K), E5M2 if kind == "row" else E4M3, 82)
    b = w.t() if layout == "col-major" else w.t().contiguous()
    assert b.shape == (K, N) and b.is_contiguous() == (layout == "row-major")
    sa, sb = ops_scales(kind, M, N, K, 83)
    g = torch.Generator().manual_seed(84)
    bias = (torch.randn(N, generator=g) * 10).to(out_dtype) if with_bias else None
    c = fp8_scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    assert c.dtype == out_dtype and c.shape == (M, N)
    assert rel_err(c, ops_reference(a, b, sa, sb, kind, bias)) < TOL[out_dtype]


@pytest.mark.parametrize("bias_kind", ["float64", "strided", "fp16 into fp32"])
def test_ops_bias_of_any_layout_and_float_dtype(fresh_fp8_calls, bias_kind):
    """A bias the kernel takes as it is (a result dtype, contiguous) goes in directly; others are
    converted to the result's dtype first; cached calls do the same with new values."""
    M, N, K = 70, 136, 300
    out = torch.float32 if bias_kind == "fp16 into fp32" else torch.bfloat16
    for seed in (1, 2):
        a, w = fp8((M, K), E4M3, seed), fp8((N, K), E4M3, seed + 10)
        sa, sb = ops_scales("row", M, N, K, seed + 20)
        values = torch.randn(2 * N, generator=torch.Generator().manual_seed(seed)) * 10
        bias = {"float64": values[:N].double(), "strided": values.to(torch.bfloat16)[::2],
                "fp16 into fp32": values[:N].half()}[bias_kind]
        c = fp8_scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=out)
        assert rel_err(c, ops_reference(a, w.t(), sa, sb, "row", bias)) < TOL[out]
    assert len(fp8_ops._calls) == 1


def test_ops_block_scales_in_either_layout_give_the_same_numbers():
    """torch's block-wise A scales are M-major (strides (1, M)): the kernel takes them
    k-block-major (``transpose_A_scale``), row-major ones as they are; the same numbers."""
    M, N, K = 100, 136, 300
    a, w = fp8((M, K), E4M3, 95), fp8((N, K), E4M3, 96)
    sa, sb = ops_scales("block", M, N, K, 97)
    sa_m = sa.t().contiguous().t()
    assert sa_m.stride() == (1, M) and sa.stride() == (cdiv(K, 128), 1)
    assert kernel_inputs(a, w.t(), sa_m, sb)[0][-1] and not kernel_inputs(a, w.t(), sa, sb)[0][-1]
    c = fp8_scaled_mm(a, w.t(), sa, sb)
    assert torch.equal(c, fp8_scaled_mm(a, w.t(), sa_m, sb))
    assert rel_err(c, ops_reference(a, w.t(), sa, sb, "block", None)) < TOL[torch.bfloat16]


def test_ops_fast_accum_same_numbers_on_cpu():
    M, N, K = 70, 72, 300
    a, w = fp8((M, K), E4M3, 91), fp8((N, K), E4M3, 92)
    sa, sb = ops_scales("row", M, N, K, 93)
    c1 = fp8_scaled_mm(a, w.t(), sa, sb, out_dtype=torch.float32)
    c2 = fp8_scaled_mm(a, w.t(), sa, sb, out_dtype=torch.float32, use_fast_accum=True)
    ref = ops_reference(a, w.t(), sa, sb, "row", None)
    assert rel_err(c1, ref) < 1e-5 and rel_err(c2, ref) < 1e-5


@pytest.mark.parametrize("M, N, K", [(0, 72, 300), (64, 72, 0), (0, 72, 0)])
@pytest.mark.parametrize("kind", ["tensor", "row"])
def test_ops_zero_size(M, N, K, kind):
    a = fp8((M, K), E4M3, 1) if M * K else torch.empty(M, K).to(E4M3)
    w = fp8((N, K), E4M3, 2) if K else torch.empty(N, K).to(E4M3)
    sa, sb = ops_scales(kind, M, N, K, 3)
    bias = torch.arange(N, dtype=torch.bfloat16)
    c = fp8_scaled_mm(a, w.t(), sa, sb)
    assert c.shape == (M, N) and c.dtype == torch.bfloat16 and (c == 0).all()
    c = fp8_scaled_mm(a, w.t(), sa, sb, bias=bias)
    assert c.shape == (M, N) and torch.equal(c, bias.expand(M, N))


@pytest.mark.parametrize("kind, b_layout, sa_layout", [
    ("tensor", "col-major", ""), ("tensor", "row-major", "0-dim"), ("row", "col-major", ""),
    ("block", "col-major", "m-major"), ("block", "col-major", "row-major"),
    ("block", "row-major", "m-major")])
def test_ops_cached_calls_take_each_call_s_data(fresh_fp8_calls, kind, b_layout, sa_layout):
    """First and cached calls of one kind, new data each time (a not contiguous on alternate
    kinds, so its copy is part of the call; block-wise b scales contiguous in the intrinsic's
    orientation for the m-major kind: copied per call), against float64."""
    M, N, K = 70, 136, 300
    for seed in (0, 1, 2):
        for strided_a in (False, True):
            a = fp8((M, K), E4M3, 100 + seed)
            if strided_a:
                a = a.t().contiguous().t()
            w = fp8((N, K), E4M3, 110 + seed)
            b = w.t() if b_layout == "col-major" else w.t().contiguous()
            sa, sb = ops_scales(kind, M, N, K, 120 + 2 * seed)
            if sa_layout == "0-dim":
                sa = sa.reshape(())
            if sa_layout == "m-major":
                sa, sb = sa.t().contiguous().t(), sb.contiguous()
            c = fp8_scaled_mm(a, b, sa, sb)
            assert rel_err(c, ops_reference(a, b, sa, sb, kind, None)) < TOL[torch.bfloat16]
    assert len(fp8_ops._calls) == 2


def test_ops_cached_call_does_each_piece_of_work_once(fresh_fp8_calls, monkeypatch):
    M, N, K = 70, 136, 300
    sa, sb = ops_scales("block", M, N, K, 5)
    sa = sa.t().contiguous().t()
    a, w = fp8((M, K), E4M3, 1), fp8((N, K), E4M3, 2)
    fp8_scaled_mm(a, w.t(), sa, sb)
    args, operands = kernel_inputs(a, w.t(), sa, sb)
    kernel = fp8_ops.scaled_mm_kernel(*args, ())           # as the op makes it: no tiling tuned

    def again(*args, **kwargs):
        raise AssertionError("a cached call did this again")
    for owner, name in [(fp8_ops, "kernel_mapping"), (fp8_ops, "_scales"), (fp8_ops, "scaled_mm_kernel"),
                        (kernel.binder, "_fast"), (kernel.binder, "_signature"),
                        (kernel.binder, "_check")]:
        monkeypatch.setattr(owner, name, again)
    for seed in (3, 4):
        a, w = fp8((M, K), E4M3, seed), fp8((N, K), E4M3, seed + 10)
        c = fp8_scaled_mm(a, w.t(), sa, sb)
        assert rel_err(c, ops_reference(a, w.t(), sa, sb, "block", None)) < TOL[torch.bfloat16]


def test_ops_cached_call_costs_little_more_than_the_kernel(fresh_fp8_calls, monkeypatch):
    """The launch stubbed (a no-op), a cached ``fp8_scaled_mm`` call against calling its kernel
    with operands already mapped: the call adds the key, one lookup, and mapping the inputs
    (here: the transposed views of b and both scales). ~4 us the kernel, ~6 us the op on this CPU
    when idle; the first version of the op spent ~24 us."""
    M, N, K = 64, 256, 256
    a, w = fp8((M, K), E4M3, 1), fp8((N, K), E4M3, 2)
    sa, sb = ops_scales("block", M, N, K, 3)
    sa, sb = sa.t().contiguous().t(), sb.t().contiguous().t()      # torch's block-wise layouts
    args, operands = kernel_inputs(a, w.t(), sa, sb)
    kernel = fp8_ops.scaled_mm_kernel(*args, ())           # as the op makes it: no tiling tuned
    monkeypatch.setattr(kernel.program, "launch", lambda values: None)
    b = w.t()
    n, best = 2000, {}
    for _ in range(7):                                 # interleaved, best of 7
        for name, fn in (("kernel", lambda: kernel(*operands)), ("op", lambda: fp8_scaled_mm(a, b, sa, sb))):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - start) / n * 1e6)
    assert best["op"] < 2.5 * best["kernel"], best      # the old path: ~6x (both scale with load)


def test_ops_bad_bias_is_named_on_first_and_cached_calls(fresh_fp8_calls):
    M, N, K = 64, 72, 300
    a, w = fp8((M, K), E4M3, 1), fp8((N, K), E4M3, 2)
    sa, sb = ops_scales("row", M, N, K, 3)
    fp8_scaled_mm(a, w.t(), sa, sb)
    for bias in (torch.ones(N + 1), [1.0] * N):
        with pytest.raises(ValueError, match=r"bias must be a \[72\] tensor on cpu"):
            fp8_scaled_mm(a, w.t(), sa, sb, bias=bias)


def test_ops_torch_compile_traces_through_the_custom_op(fresh_fp8_calls):
    M, N, K = 70, 136, 300
    a, w = fp8((M, K), E4M3, 1), fp8((N, K), E4M3, 2)
    sa, sb = ops_scales("block", M, N, K, 3)
    sa = sa.t().contiguous().t()
    bias = torch.randn(N).to(torch.bfloat16)

    def f(a, b, sa, sb, bias):
        return torch.relu(fp8_scaled_mm(a, b, sa, sb, bias=bias))
    graphs = []

    def record(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm
    want = f(a, w.t(), sa, sb, bias)
    assert rel_err(want, ops_reference(a, w.t(), sa, sb, "block", bias).relu()) < TOL[torch.bfloat16]
    assert torch.equal(torch.compile(f, fullgraph=True, backend=record)(a, w.t(), sa, sb, bias), want)
    assert "tilews.fp8_scaled_mm" in graphs[0]
    assert torch.equal(torch.compile(f, fullgraph=True)(a, w.t(), sa, sb, bias), want)


@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
def test_ops_opcheck(fresh_fp8_calls, kind):
    M, N, K = 20, 136, 300
    a, w = fp8((M, K), E4M3, 1), fp8((N, K), E5M2, 2)
    sa, sb = ops_scales(kind, M, N, K, 3)
    # test_schema is left out: its check that inputs are not mutated compares them with an
    # arithmetic op that torch does not implement for float8 on the CPU
    checks = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    result = torch.library.opcheck(torch.ops.tilews.fp8_scaled_mm.default,
                                   (a, w.t(), sa, sb, None, torch.float32, False), test_utils=checks)
    assert result == dict.fromkeys(checks, "SUCCESS")


class KernelSpy:
    """Stands in for ``scaled_mm_kernel``: records the ``tiles`` each kernel is made with and
    builds it; a kernel of the tiling ``wrong`` returns its result times 1.05."""

    def __init__(self, monkeypatch, wrong=None):
        self.made, self.wrong, self.real = [], wrong, fp8_ops.scaled_mm_kernel
        self.target = self.real.target
        monkeypatch.setattr(fp8_ops, "scaled_mm_kernel", self)

    def __call__(self, *args, tiles=()):
        if len(args) > 11:
            args, tiles = args[:11], args[11]
        self.made.append(tiles)
        kernel = self.real(*args, tiles=tiles)
        if self.wrong is not None and tiles == self.wrong.hints():
            return lambda *operands: kernel(*operands) * 1.05
        return kernel


def block_inputs(M, N, K, seed):
    a, w = fp8((M, K), E4M3, seed), fp8((N, K), E4M3, seed + 1)
    sa, sb = ops_scales("block", M, N, K, seed + 2)
    return a, w.t(), sa.t().contiguous().t(), sb.t().contiguous().t()      # torch's layouts


def test_tiles_text_round_trip_and_errors():
    t = fp8_ops.Tiles(64, 128, 8, 128)
    assert str(t) == "64x128 s8 t128" and fp8_ops.Tiles.from_text(str(t)) == t
    assert fp8_ops.Tiles.from_text("64x128s8t128") == t          # scripts/tune_fp8.py --tiles
    assert t.hints() == (("block_M", 64), ("block_N", 128), ("num_stages", 8), ("threads", 128))
    for bad in ("64x128", "64x128 s8", 64, "a x b s1 t1"):
        with pytest.raises(ValueError, match="is not a tiling"):
            fp8_ops.Tiles.from_text(bad)


@pytest.mark.parametrize("out, promote, transpose_B, count", [
    (T.bfloat16, True, True, 4), (T.bfloat16, False, False, 4), (T.bfloat16, True, False, 3),
    (T.float32, True, True, 3)])
def test_hopper_tile_candidates_fit_shared_memory(out, promote, transpose_B, count):
    space = fp8_language.tile_candidates("hopper", out, promote, transpose_B)
    assert len(space) == count and (space[0]["block_N"] == 256) == (count == 4)
    for t in space:
        ring = t["num_stages"] * ((t["block_M"] + t["block_N"]) * SCALE_BLOCK + 4 * t["block_M"])
        assert ring + t["block_M"] * t["block_N"] * out.itemsize <= HOPPER.caps.smem_bytes - 4096, t
    assert fp8_language.tile_candidates("interpret", out, promote, transpose_B) == [
        dict(block_M=64, block_N=64, num_stages=2, threads=128),
        dict(block_M=64, block_N=32, num_stages=2, threads=128)]


def test_tune_fp8_keeps_the_winner_and_the_op_uses_it(fresh_fp8_calls, monkeypatch, caplog):
    a, b, sa, sb = block_inputs(70, 136, 300, 40)
    with caplog.at_level(logging.INFO, logger="tilews.ops"):
        winner = ops.tune_fp8(a, b, sa, sb, warmup=1, rep=2)
    timed = [r.getMessage() for r in caplog.records if r.getMessage().endswith(" ms")]
    assert len(timed) == 2 and str(winner) in " ".join(timed), timed
    [entry] = tuned_entries(fresh_fp8_calls, "fp8_scaled_mm")
    assert entry["winner"] == str(winner)
    assert entry["key"] == ["cpu", "float8_e4m3fn", "float8_e4m3fn", "bfloat16", "BLOCK", "BLOCK",
                            True, False, True, 136, 300, 128]
    # A new process (nothing in memory) follows the disk, even an entry edited by hand, for
    # every M of the bucket; another bucket keeps the target's own tiles.
    chosen = fp8_ops.Tiles(64, 32, 2, 128)
    [path] = (fresh_fp8_calls / "ops" / "fp8_scaled_mm").glob("*.json")
    path.write_text(json.dumps({**entry, "winner": str(chosen)}))
    monkeypatch.setattr(fp8_ops._winners, "tuned", {})
    spy = KernelSpy(monkeypatch)
    for M in (100, 30):
        a, b, sa, sb = block_inputs(M, 136, 300, M)
        c = fp8_scaled_mm(a, b, sa, sb)
        assert rel_err(c, ops_reference(a, b, sa, sb, "block", None)) < TOL[torch.bfloat16]
    assert spy.made == [chosen.hints(), ()]


def test_tune_fp8_drops_wrong_candidates(fresh_fp8_calls, monkeypatch):
    bad, good = fp8_ops.Tiles(64, 64, 2, 128), fp8_ops.Tiles(64, 32, 2, 128)
    KernelSpy(monkeypatch, wrong=bad)
    a, b, sa, sb = block_inputs(70, 136, 300, 50)
    assert ops.tune_fp8(a, b, sa, sb, torch.float32, warmup=1, rep=2) == good
    monkeypatch.setattr(fp8_ops, "tile_candidates", lambda *args: [vars(bad)])
    with pytest.raises(RuntimeError, match=r"(?s)no candidate.*64x64 s2 t128: AssertionError"):
        ops.tune_fp8(a, b, sa, sb, torch.float32, warmup=1, rep=2)
    with pytest.raises(ValueError, match=r"nothing to tune in an empty product \(M, N, K = 0, 136, 300\)"):
        ops.tune_fp8(a[:0], b, sa[:0], sb)


def test_tune_fp8_takes_1d_row_and_column_scales(fresh_fp8_calls):
    """Scales [M] and [N], which the op accepts as per row / column: the tuner's float32
    reference scales rows of a and columns of b by them."""
    M, N, K = 70, 136, 300
    a, w = fp8((M, K), E4M3, 70), fp8((N, K), E4M3, 71)
    sa, sb = ops_scales("row", M, N, K, 72)
    winner = ops.tune_fp8(a, w.t(), sa.reshape(M), sb.reshape(N), warmup=1, rep=2)
    assert winner in [fp8_ops.Tiles(**t) for t in fp8_language.tile_candidates(
        "interpret", T.bfloat16, True, True)]
    c = fp8_scaled_mm(a, w.t(), sa.reshape(M), sb.reshape(N))
    assert rel_err(c, ops_reference(a, w.t(), sa, sb, "row", None)) < TOL[torch.bfloat16]


def test_env_switch_tunes_fp8_at_the_first_call(fresh_fp8_calls, monkeypatch):
    monkeypatch.setenv("TILEWS_TUNE", "1")
    assert tuned_entries(fresh_fp8_calls, "fp8_scaled_mm") == []
    for seed in (60, 61):
        a, b, sa, sb = block_inputs(20, 136, 300, seed)
        c = fp8_scaled_mm(a, b, sa, sb)
        assert rel_err(c, ops_reference(a, b, sa, sb, "block", None)) < TOL[torch.bfloat16]
        [entry] = tuned_entries(fresh_fp8_calls, "fp8_scaled_mm")     # the second call: no tuning
    assert entry["key"][-1] == 32


# ----------------------------------------------------------------------------------------------
# 7. Hopper lowering: the interpreter as oracle


ORACLE = [
    # (granularity, pair, out, fast): M=200, N=264, K=304 (rows of A and B: 304 bytes, TMA-able)
    ("row-1d", "e4m3-e4m3", torch.bfloat16, True),
    ("tensor-0d", "e4m3-e5m2", torch.float16, False),
    ("block", "e5m2-e5m2", torch.float32, False),
    ("block-t", "e4m3-e4m3", torch.bfloat16, False),      # A's scales through the ring
]


def hopper_before_after(gran, pair, out, fast, transpose_B=True, M=200, N=264, K=304, hints=WIDE):
    sas, sbs = GRANS[gran](M, N, K)
    a_dt, b_dt = PAIRS[pair]
    prim = scaled_gemm(M, N, K, sas, sbs, transpose_B, fast, _T[a_dt], _T[b_dt], _T[out],
                       **scale_kwargs(gran), **hints)
    before = build_kernel(prim, target="hopper")
    return before, lower(before, HOPPER)


@pytest.mark.parametrize("gran, pair, out, fast", ORACLE, ids=[c[0] for c in ORACLE])
def test_hopper_oracle_before_equals_after(gran, pair, out, fast):
    M, N, K = 200, 264, 304
    before, after = hopper_before_after(gran, pair, out, fast)
    assert after.find_plan(AsyncPlan) is not None, after.find_plan(AsyncRefusal)
    assert any(isinstance(s, ir.WarpSpecialize) for s in walk(after.body))
    promotes = gran.startswith("block") or not fast
    assert before.fp8_promote_every == after.fp8_promote_every == (128 if promotes else 0)
    sas, sbs = GRANS[gran](M, N, K)
    a_dt, b_dt = PAIRS[pair]
    a, b = fp8((M, K), a_dt, 101), fp8((N, K), b_dt, 102)
    sa, sb = positive(sas, 103), positive(sbs, 104)
    args = [a, sa, b, sb, torch.empty(M, N, dtype=out)]
    want = run_interp(before, args, 4)
    assert rel_err(want, reference(a, a_scale_as_given(gran, sa), b, sb, gran.startswith("block"))) < TOL[out]
    for seed in range(20):
        got = run_interp(after, args, 4, seed)
        assert torch.equal(got, want), f"seed {seed}: after passes differs from before"


def test_gluon_source_with_0dim_scales_is_python():
    _, after = hopper_before_after("tensor-0d", "e4m3-e4m3", torch.bfloat16, False)
    assert after.find_plan(AsyncPlan) is not None
    compile(gluon_emit(after), "gluon-source", "exec")


def test_hopper_n_major_b_is_refused():
    before, after = hopper_before_after("row-1d", "e4m3-e4m3", torch.bfloat16, False, transpose_B=False)
    assert after.find_plan(AsyncPlan) is None
    reason = after.plan(AsyncRefusal).reason
    assert "K-major" in reason and "transpose_B=True" in reason


def test_hopper_rows_tma_cannot_take_are_refused():
    _, after = hopper_before_after("block", "e4m3-e4m3", torch.bfloat16, False, K=300)
    assert after.find_plan(AsyncPlan) is None
    assert "rows of 'A' are 300 bytes, not a multiple of 16" in after.plan(AsyncRefusal).reason


# ----------------------------------------------------------------------------------------------
# 8. compile-only sm_90a


COMPILED = {
    # name: (granularity, pair, fast)
    "block-e4m3-e4m3": ("block", "e4m3-e4m3", False),
    "block-e4m3-e5m2": ("block", "e4m3-e5m2", False),
    "block-t-e4m3-e4m3": ("block-t", "e4m3-e4m3", False),
    "row-e4m3-e4m3-fast": ("row-1d", "e4m3-e4m3", True),
    "row-e4m3-e5m2": ("row-2d", "e4m3-e5m2", False),
}


@functools.lru_cache(maxsize=None)
def compiled(name):
    gran, pair, fast = COMPILED[name]
    _, k = hopper_before_after(gran, pair, torch.bfloat16, fast)
    assert k.find_plan(AsyncPlan) is not None
    return k, gluon_program(k)


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_fp8_gemm(name):
    gran, pair, fast = COMPILED[name]
    k, p = compiled(name)
    ttgir, ptx = p.asm["ttgir"], p.asm["ptx"]
    kinds = pair.replace("-", ".")                          # e4m3.e4m3 / e4m3.e5m2
    wgmma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.(\w+\.\w+)", ptx))
    assert wgmma == {kinds}, wgmma
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)) >= 2
    assert ttgir.count("ttg.warp_specialize(") == 1
    promote = 128 if (gran.startswith("block") or not fast) else 0
    assert k.fp8_promote_every == promote
    verify_fp8(ttgir, name, promote)
    verify_fp8(ttgir, name, 0)
    if promote == 0:          # one accumulator across all of K: the promotion rule fails it
        with pytest.raises(CompileError, match="accumulates more than promote_every = 128"):
            verify_fp8(ttgir, name, 128)


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_fp8_gemm_keeps_wgmma_pipelined(name):
    """ptxas neither serializes the wgmmas (C7514: registers of an in-flight wgmma read by other
    instructions) nor spills; a promoting kernel runs one consumer role per warp group, each
    with 128-column accumulators (the probe's fast schedule: scripts/probe_fp8_gluon.py)."""
    gran, _, fast = COMPILED[name]
    k, p = compiled(name)
    report = ptxas_report(p.asm["ptx"])
    if report is None:
        pytest.skip("this triton has no bundled ptxas")
    assert "C7514" not in report, report
    assert "0 bytes spill stores" in report, report
    consumers = [r for ws in walk(k.body) if isinstance(ws, ir.WarpSpecialize)
                 for r in ws.roles if r.warpgroups != (0,)]
    promotes = gran.startswith("block") or not fast
    assert [r.warpgroups for r in consumers] == ([(1,), (2,)] if promotes else [(1, 2)])
    if promotes:
        accs = {a.buffer.name: [ir.as_int(d) for d in a.buffer.shape] for a in walk(k.body)
                if isinstance(a, ir.Alloc) and a.buffer.scope is ir.Scope.FRAGMENT
                and a.buffer.name.startswith("C_f")}
        assert sorted(accs.values()) == [[64, 128]] * 4, accs      # 2 halves x 2 column parts


def test_block_scales_are_loaded_ahead_of_their_k_block():
    """Inside the k-loop of the Hopper block-wise kernel every scale load reads a later k-block
    (A's k + 1, B's k + 2, clamped to the last), and the loop's own k-block comes from registers
    loaded earlier: a load of k-block k issued in iteration k waited on an L2 round trip within
    the iteration (0.80x rowwise ``_scaled_mm`` on an H100; 0.90-0.94x loaded ahead)."""
    K = 4 * SCALE_BLOCK + 48                # 5 k-blocks, the last one partial
    _, k = hopper_before_after("block", "e4m3-e4m3", torch.bfloat16, False, K=K)
    loops = [s for s in walk(k.body) if isinstance(s, ir.For)
             and any(isinstance(g, ir.Gemm) for g in walk(s.body))
             and not any(isinstance(f, ir.For) and f is not s for f in walk(s.body))]
    assert loops, "no k-loop"
    last = -(-K // SCALE_BLOCK) - 1
    ahead = {"A_scale": 1, "B_scale": 2}
    seen = set()
    for loop in loops:
        for stmt in walk(loop.body):
            for e in (x for top in exprs_of(stmt) for x in subexprs(top)):
                if isinstance(e, ir.Load) and e.buffer.name in ahead:
                    seen.add(e.buffer.name)
                    for kb in range(last + 1):
                        got = evaluate(e.indices[-1], {loop.var: kb})
                        assert got == min(kb + ahead[e.buffer.name], last), \
                            (e.buffer.name, kb, got)
    assert seen == set(ahead), seen


def _scale_loads_by_place(k) -> dict:
    """Per consumer role of the Hopper kernel: the statements of the k-loop's statement list
    (the innermost loop issuing gemms, and its siblings) that load A_scale or B_scale, keyed by
    where they stand: "before" the k-loop, "after" it ahead of the first copy, "late" (after a
    copy)."""
    places = {}
    for role in (r for ws in walk(k.body) if isinstance(ws, ir.WarpSpecialize) for r in ws.roles):
        seqs = [s for s in (role.body, *walk(role.body)) if isinstance(s, ir.Seq) and any(
            isinstance(f, ir.For) and any(isinstance(g, ir.Gemm) for g in walk(f.body))
            and not any(isinstance(x, ir.For) and x is not f for x in walk(f.body)) for f in s.stmts)]
        if not seqs:
            continue
        where, seen = "before", {"before": 0, "after": 0, "late": 0}
        for stmt in seqs[0].stmts:
            if isinstance(stmt, ir.For) and any(isinstance(g, ir.Gemm) for g in walk(stmt.body)):
                where = "after"
                continue
            if isinstance(stmt, ir.Copy) and where == "after":
                where = "late"
            loads = [e for s in (stmt, *walk(stmt)) for top in exprs_of(s) for e in subexprs(top)
                     if isinstance(e, ir.Load)]
            if any(e.buffer.name in ("A_scale", "B_scale") for e in loads):
                seen[where] += 1
        places[role.warpgroups] = seen
    return places


def test_outer_scales_are_loaded_where_their_round_trips_hide():
    """Per-row/column scales: with one accumulator (fast) every load is issued before the k-loop
    (into fragments); a promoting tile scales all its parts in one statement after the k-loop,
    before its first store, so no part's loads wait behind another part's store (H100: fast
    8192^3 1.013x, rowwise promoted 1.019x against loads per part)."""
    _, fast = hopper_before_after("row-2d", "e4m3-e4m3", torch.bfloat16, True)
    assert list(_scale_loads_by_place(fast).values()) == [{"before": 2, "after": 0, "late": 0}]
    _, promoted = hopper_before_after("row-2d", "e4m3-e4m3", torch.bfloat16, False)
    places = _scale_loads_by_place(promoted)
    assert sorted(places) == [(1,), (2,)], places          # split: one role per warp group
    assert all(p == {"before": 0, "after": 1, "late": 0} for p in places.values()), places


def _scale_loads(role, name: str = "A_scale") -> list:
    """Element loads of the global scales ``name`` in ``role``."""
    return [e for s in walk(role.body) for top in exprs_of(s) for e in subexprs(top)
            if isinstance(e, ir.Load) and e.buffer.name == name]


def test_k_block_major_a_scales_travel_with_their_tiles():
    """A's block scales given k-block-major (``transpose_A_scale``: torch's layout) with rows of
    whole 16-byte units: the producer bulk-copies each k-block's 128 row scales into a ring slot
    beside the A and B tiles, completing on their barrier (one full/empty pair), and each
    consumer warp group reads its 64 rows from shared memory, loading none from global memory
    (H100, 8192^3: 0.95x rowwise ``_scaled_mm`` where consumer loads gave 0.89-0.91x). Rows of
    M * 4 bytes not a multiple of 16 (no TMA) keep the consumer loads, one k-block ahead."""
    _, k = hopper_before_after("block-t", "e4m3-e4m3", torch.bfloat16, False)        # M = 200
    by_wg = roles(k)
    assert sorted(by_wg) == [(0,), (1,), (2,)]
    copies = [s for s in walk(by_wg[(0,)].body) if isinstance(s, ir.Copy)]
    scales = [s for s in copies if s.src.buffer.name == "A_scale"]
    assert len(scales) == 1 and scales[0].mechanism is ir.CopyMechanism.TMA, scales
    assert scales[0].src.extents == (1, 128)
    assert {s.barrier.buffer.name for s in copies} == {"full"}
    ring = scales[0].dst.buffer
    assert ring.static_shape == (3, 128)                                             # 3 stages
    for h in range(2):
        consumer = by_wg[(h + 1,)]
        reads = [s for s in walk(consumer.body) if isinstance(s, ir.Copy) and s.src.buffer == ring]
        assert len(reads) == 1 and reads[0].dst.buffer.scope is ir.Scope.FRAGMENT
        assert ir.as_int(reads[0].src.starts[1]) == 64 * h and reads[0].src.extents == (1, 64)
        assert not _scale_loads(consumer)
    barriers = {a.buffer.name for a in walk(k.body)
                if isinstance(a, ir.Alloc) and a.buffer.scope is ir.Scope.BARRIER}
    assert barriers == {"full", "empty"}, barriers
    src = gluon_emit(k)
    for h in range(2):
        assert f"A_scale_s.index(k % 3).slice({64 * h}, 64).load(" in src
    assert "gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1" in src
    ptx = compiled("block-t-e4m3-e4m3")[1].asm["ptx"]
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global", ptx)) >= 3
    assert re.search(r"ld\.shared\.(b32|f32)", ptx)

    _, unaligned = hopper_before_after("block-t", "e4m3-e4m3", torch.bfloat16, False, M=201)
    by_wg = roles(unaligned)
    assert not [s for s in walk(by_wg[(0,)].body)
                if isinstance(s, ir.Copy) and s.src.buffer.name == "A_scale"]
    assert _scale_loads(by_wg[(1,)]) and _scale_loads(by_wg[(2,)])


@pytest.mark.parametrize("sms", [0, 2], ids=["one-tile-per-block", "persistent"])
@pytest.mark.parametrize("tiles", ["wide", "narrow"])
def test_b_block_scales_are_preloaded_per_tile(tiles, sms):
    """With A's scales through the ring, each 128-column block of the tile gets its row of B's
    block scales in one bulk copy before the k-loop (a box from k-block 0, 32 scales wide where
    K has 8 blocks: the rest fill with zeros), completing on the ``preloaded`` barrier (in a
    persistent kernel per tile, into one of two slots, released through ``reloadable``); the
    consumers read k-block k's scale from shared memory and load none from global memory
    (H100, 128 x 4096 x 4096, 64 x 128 tiles: 0.79x rowwise ``_scaled_mm`` with those loads,
    1.06x without). The interpreter gives the same bits before and after lowering, and the
    float64 product."""
    M, N, K = 200, 264, 1024
    hints = WIDE if tiles == "wide" else dict(block_M=64, block_N=64, num_stages=4, threads=128)
    sas, sbs = GRANS["block-t"](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, False, T.float8_e4m3, T.float8_e4m3, T.bfloat16,
                       sa_t=True, **hints)
    before = build_kernel(prim, target="hopper")
    after = lower(before, HOPPER.replace(num_sms=sms))
    assert after.find_plan(AsyncPlan) is not None, after.find_plan(AsyncRefusal)
    by_wg = roles(after)
    rows = [s for s in walk(by_wg[(0,)].body) if isinstance(s, ir.Copy) and s.src.buffer.name == "B_scale"]
    assert len(rows) == (2 if tiles == "wide" else 1)
    for r in rows:
        assert r.mechanism is ir.CopyMechanism.TMA and r.src.extents == (1, 32)
        assert ir.as_int(r.src.starts[1]) == 0 and r.barrier.buffer.name == "preloaded"
        assert r.dst.buffer.static_shape == ((2, 32) if sms else (32,))
    consumers = [wg for wg in by_wg if wg != (0,)]
    assert len(consumers) == (2 if tiles == "wide" else 1)
    for wg in consumers:
        assert not _scale_loads(by_wg[wg], "B_scale")
        reads = [x for s in walk(by_wg[wg].body) for e in exprs_of(s) for x in subexprs(e)
                 if isinstance(x, ir.Load) and x.buffer.name.startswith("B_scale_s")]
        assert reads and all(ir.as_int(x.indices[-1]) is None for x in reads)   # at k
    barriers = {a.buffer.name for a in walk(after.body)
                if isinstance(a, ir.Alloc) and a.buffer.scope is ir.Scope.BARRIER}
    assert barriers == {"full", "empty", "preloaded"} | ({"reloadable"} if sms else set())
    src = gluon_emit(after)
    assert re.search(r"B_scale_s\w*(\.index\(tile_iter % 2\))?\._reinterpret\(gl\.float32, \[32, 1\], "
                     r"\w+\)\.index\(k\)\.load\(", src), src
    a, b = fp8((M, K), E4M3, 121), fp8((N, K), E4M3, 122)
    sa, sb = positive(sas, 123), positive(sbs, 124)
    args = [a, sa, b, sb, torch.empty(M, N, dtype=torch.bfloat16)]
    want = run_interp(before, args, 4)
    assert rel_err(want, reference(a, sa.t(), b, sb, True)) < TOL[torch.bfloat16]
    for seed in range(6):
        assert torch.equal(run_interp(after, args, 4, seed), want), seed
    report = ptxas_report(gluon_program(after).asm["ptx"])
    if report is not None:
        assert "0 bytes spill stores" in report and "C7514" not in report, report


def test_b_block_scales_without_bulk_rows_stay_consumer_loads():
    """B's scale rows of K / 128 * 4 bytes not a multiple of 16 (K = 640: 5 k-blocks) are no
    bulk copy: the consumers load them, two k-blocks ahead."""
    M, N, K = 200, 264, 640
    sas, sbs = GRANS["block-t"](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, False, T.float8_e4m3, T.float8_e4m3, T.bfloat16,
                       sa_t=True, **WIDE)
    by_wg = roles(lower(build_kernel(prim, target="hopper"), HOPPER))
    assert not [s for s in walk(by_wg[(0,)].body) if isinstance(s, ir.Copy)
                and s.src.buffer.name == "B_scale"]
    assert _scale_loads(by_wg[(1,)], "B_scale") and _scale_loads(by_wg[(2,)], "B_scale")


def test_bulk_copies_into_ring_slots_off_128_bytes_are_refused(monkeypatch):
    """A bulk copy writes shared memory at 128-byte aligned addresses: a ring (or slotted
    preload) whose slots are not whole 128-byte units is refused, naming the buffer (on an H100
    a bulk copy started off that alignment faulted: 'illegal instruction')."""
    monkeypatch.setattr(fp8_language, "_ROW_LEAST", 4)          # 16-byte rows of B's scales
    M, N, K = 200, 264, 512
    sas, sbs = GRANS["block-t"](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, False, T.float8_e4m3, T.float8_e4m3, T.bfloat16,
                       sa_t=True, **WIDE)
    after = lower(build_kernel(prim, target="hopper"), HOPPER.replace(num_sms=2))
    refusal = after.find_plan(AsyncRefusal)
    assert refusal is not None and "'B_scale_s" in refusal.reason and "128" in refusal.reason


@pytest.mark.parametrize("M, N, out, want", [
    (128, 4096, torch.bfloat16, (64, 64, 12, 128)),        # 128 tiles of 64 x 64 fill 132 SMs
    (128, 14336, torch.bfloat16, (128, 128, 5, 256)),      # 112 of 128 x 128
    (1024, 4096, torch.bfloat16, (128, 256, 3, 256)),      # 128 of 128 x 256: one wave, 97% busy
    (1024, 14336, torch.bfloat16, (128, 128, 5, 256)),     # 448 of 128 x 256: last wave 39% busy
    (8192, 8192, torch.bfloat16, (128, 256, 3, 256)),
    (8192, 8192, torch.float32, (128, 128, 4, 256)),       # fp32 staging: no 128 x 256, fewer stages
    (16, 4096, torch.bfloat16, (64, 64, 12, 128)),         # none fills: the smallest
    (16, 14336, torch.bfloat16, (64, 128, 8, 128)),        # 112 of 64 x 128: no 128-row tiles
    (64, 14336, torch.float32, (64, 128, 7, 128)),         # fp32 staging: one stage fewer
])
def test_whole_gemm_tiles_follow_the_shape(monkeypatch, M, N, out, want):
    monkeypatch.setattr(fp8_language, "num_sms", lambda: 132)
    got = fp8_language._tiles("hopper", _T[out], True, True, M, N)
    assert (got["block_M"], got["block_N"], got["num_stages"], got["threads"]) == want


# ----------------------------------------------------------------------------------------------
# 9. T.macro


@T.macro
def axpy(X, Y, alpha, n):
    for i in T.Parallel(n):
        Y[i] = Y[i] + X[i] * alpha


@T.macro
def load_scaled(X, start, n, alpha):
    t = T.alloc_fragment((n,), T.float32)
    for i in T.Parallel(n):
        t[i] = X[start + i] * alpha
    return t


@T.macro
def scaled_sum_into(X, Y, start, n, alpha, beta):          # nested: calls two macros
    t = load_scaled(X, start, n, alpha)
    axpy(t, Y, beta, n)


@T.macro
def element(X, i):
    return X[i] * 2.0


def test_macro_inlined_twice_with_different_arguments():
    n = 64

    @T.prim_func
    def main(X: T.Tensor((2 * n,), T.float32), Y: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_fragment((n,), T.float32)
            T.clear(acc)
            a = load_scaled(X, 0, n, 2.0)
            axpy(a, acc, 1.0, n)
            b = load_scaled(X, n, n, -1.0)
            axpy(b, acc, 0.5, n)
            T.copy(acc, Y[0])
    k = build_kernel(main)
    x, y = torch.randn(2 * n), poisoned(n)
    interpreter.run(k, [x, y])
    torch.testing.assert_close(y, 2 * x[:n] - 0.5 * x[n:])


def test_macro_nested_and_returning_a_value():
    n = 32

    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_fragment((n,), T.float32)
            T.clear(acc)
            scaled_sum_into(X, acc, 0, n, 3.0, 2.0)
            for i in T.Parallel(n):
                acc[i] = acc[i] + element(X, i)
            T.copy(acc, Y[0])
    x, y = torch.randn(n), poisoned(n)
    interpreter.run(build_kernel(main), [x, y])
    torch.testing.assert_close(y, 8 * x)


@T.macro
def positive_rows(X, acc, rows, n):
    """Runtime loop over ``rows`` (a runtime scalar) with a runtime branch per row."""
    for r in T.serial(rows):
        if r % 2 == 0:
            for i in T.Parallel(n):
                acc[i] += T.max(X[r, i], 0.0)
        else:
            for i in T.Parallel(n):
                acc[i] -= X[r, i]


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_macro_with_runtime_loop_and_branch(rows):
    n = 16

    @T.prim_func
    def main(X: T.Tensor((8, n), T.float32), Y: T.Tensor((n,), T.float32), rows: T.int32):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_fragment((n,), T.float32)
            T.clear(acc)
            positive_rows(X, acc, rows, n)
            T.copy(acc, Y[0])
    k = build_kernel(main)
    assert any(isinstance(s, ir.For) for s in walk(k.body))
    x, y = torch.randn(8, n), poisoned(n)
    interpreter.run(k, [x, y, rows])
    want = torch.zeros(n)
    for r in range(rows):
        want = want + x[r].clamp_min(0) if r % 2 == 0 else want - x[r]
    torch.testing.assert_close(y, want)


def _early_return_macro():
    @T.macro
    def early(X, n):
        t = X[0] * 2.0
        return t  # <- early return
        X[0] = t  # noqa: F841
    return early


def _return_in_loop_macro():
    @T.macro
    def in_loop(X, n):
        for i in T.serial(n):
            return X[i]  # <- return in loop
    return in_loop


def _nested_def_macro():
    @T.macro
    def nested(X, n):
        def twice(v):  # <- nested def
            return v * 2.0
        X[0] = twice(X[0])
    return nested


def _user_of(mac):
    @T.prim_func
    def main(X: T.Tensor((8,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            mac(X, 4)
    return main


@pytest.mark.parametrize("maker, marker, fragment", [
    (_early_return_macro, "# <- early return", "returns before the end of its body"),
    (_return_in_loop_macro, "# <- return in loop", "returns only at the end of its body"),
    # a function defined in a macro returns for itself: refused as what it is, not as the
    # macro's early return
    (_nested_def_macro, "# <- nested def", "unsupported statement in a kernel: FunctionDef"),
])
def test_macro_early_return_is_an_error(maker, marker, fragment):
    with pytest.raises(CompileError) as info:
        build_kernel(_user_of(maker()))
    e = info.value
    assert fragment in e.message, e.message
    assert e.loc is not None and e.loc.file == __file__ and e.loc.line == marked_line(maker, marker)


def _fp8_in_macro(cite_caller):
    def half_gemm(A_s, B_s, C_f):
        T.fp8_scaled_matmul(A_s, 1.0, B_s, 1.0, C_f, transpose_B=True)  # <- inside the macro
    mac = Macro(half_gemm, cite_caller=cite_caller)

    @T.prim_func
    def main(A: T.Tensor((64, 64), T.float16), B: T.Tensor((64, 64), T.float8_e4m3),
             C: T.Tensor((64, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            A_s = T.alloc_shared((64, 64), T.float16)
            B_s = T.alloc_shared((64, 64), T.float8_e4m3)
            C_f = T.alloc_fragment((64, 64), T.float32)
            T.clear(C_f)
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            mac(A_s, B_s, C_f)  # <- the macro call
            T.copy(C_f, C[0, 0])
    return main


@pytest.mark.parametrize("cite_caller", [False, True])
def test_error_inside_a_macro_points_at_its_line(cite_caller):
    """A CompileError raised by a statement of a user's macro is located at the macro's line (a
    library macro, ``cite_caller=True``, cites the caller's line instead)."""
    with pytest.raises(CompileTypeError) as info:
        build_kernel(_fp8_in_macro(cite_caller))
    e = info.value
    assert "A is f16" in e.message
    marker = "# <- the macro call" if cite_caller else "# <- inside the macro"
    assert e.loc is not None and e.loc.file == __file__
    assert e.loc.line == marked_line(_fp8_in_macro, marker), str(e)


def test_macro_statements_carry_the_macro_lines():
    n = 16

    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_fragment((n,), T.float32)
            T.clear(acc)
            axpy(X, acc, 2.0, n)
            T.copy(acc, Y[0])
    k = build_kernel(main)
    par = [s for s in walk(k.body) if isinstance(s, ir.Parallel)]
    want = marked_line(axpy.fn, "for i in T.Parallel(n):")
    assert [s.loc.line for s in par] == [want] and par[0].loc.file == __file__


def test_hopper_program_off_the_wgmma_path_reads_tiles_whole():
    """A promoting program built for Hopper whose operand rows are not whole 16-byte units (K =
    300 bytes: no TMA load) leaves the Gluon path; its wide tile is then one accumulator (the
    triton.language fallback reads shared tiles whole) and it computes the same product."""
    M, N, K, pair, out = 64, 264, 300, (torch.float8_e4m3fn, torch.float8_e4m3fn), torch.bfloat16
    sas, sbs = GRANS["row-2d"](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, False, _T[pair[0]], _T[pair[1]], _T[out], **WIDE)
    before = build_kernel(prim, target="hopper")
    assert lower(before, HOPPER).find_plan(AsyncRefusal) is not None
    accs = [s.buffer for s in walk(before.body) if isinstance(s, ir.Alloc) and s.buffer.name == "C_f"]
    assert [ir.as_int(d) for d in accs[0].shape] == [128, 256] and len(accs) == 1
    a, b = fp8((M, K), pair[0], 11), fp8((N, K), pair[1], 12)
    sa, sb = positive(sas, 13), positive(sbs, 14)
    c = poisoned(M, N, dtype=out)
    load(before, "tl").launch([a, sa, b, sb, c])
    assert rel_err(c, reference(a, sa, b, sb, False)) < TOL[out]


def test_hopper_program_with_unaligned_output_rows_stores_from_registers():
    """Output rows of 514 bytes (N = 257 bf16): no bulk store, so each split consumer role stores
    its own 64 rows of C from registers and the program stays warp-specialized (it fell back to
    triton.language while split_consumers left such a store's global tile whole); the lowered
    program computes the product on the interpreter."""
    M, N, K, pair, out = 64, 257, 256, (torch.float8_e4m3fn, torch.float8_e4m3fn), torch.bfloat16
    sas, sbs = GRANS["row-2d"](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, False, _T[pair[0]], _T[pair[1]], _T[out], **WIDE)
    lowered = lower(build_kernel(prim, target="hopper"), HOPPER)
    assert lowered.find_plan(AsyncRefusal) is None and lowered.find_plan(AsyncPlan) is not None
    stores = [s for s in walk(lowered.body) if isinstance(s, ir.Copy) and s.dst.buffer.name == "C"]
    assert sorted(s.src.buffer.name for s in stores) == ["C_f_0", "C_f_1"]
    assert [s.dst.extents[0] for s in stores] == [64, 64]
    a, b = fp8((M, K), pair[0], 11), fp8((N, K), pair[1], 12)
    sa, sb = positive(sas, 13), positive(sbs, 14)
    c = poisoned(M, N, dtype=out)
    interpreter.run(lowered, [a, sa, b, sb, c], seed=1)
    assert rel_err(c, reference(a, sa, b, sb, False)) < TOL[out]


def _epilogue_staging(kernel):
    """Per consumer role of a persistent kernel: (the staging buffers its tile loop writes, the
    ``outstanding`` of the wait before each write)."""
    out = {}
    for role in (r for ws in walk(kernel.body) if isinstance(ws, ir.WarpSpecialize)
                 for r in ws.roles if r.warpgroups != (0,)):
        tile_loop = next(s for s in role.body.stmts if isinstance(s, ir.For))
        stmts = tile_loop.body.stmts
        writes = [i for i, s in enumerate(stmts) if isinstance(s, ir.Copy)
                  and s.dst.buffer.scope is ir.Scope.SHARED]
        out[role.warpgroups] = ([stmts[i].dst.buffer.name for i in writes],
                                [stmts[i - 1].outstanding if isinstance(stmts[i - 1], ir.BulkStoreWait)
                                 else None for i in writes])
    return out


@pytest.mark.parametrize("gran", ["row-2d", "block"])
def test_persistent_parts_are_stored_through_their_own_staging_tiles(gran):
    """A promoting 128 x 256 tile stores its two 128-column parts through two staging tiles when
    shared memory holds them: the wait before each write leaves the other part's store reading
    (``bulk_store_wait 1``), so the second part never waits for the first's store (H100, 8192^3:
    row 1.007x, block-wise 1.011x against one shared tile). The verifier accepts it and catches
    a wait that leaves one store too many; the interpreter matches the program; without the
    choice, or without the shared memory, the parts share one tile and wait for all."""
    M, N, K = 384, 520, 304                  # 3 x 3 tiles of 128 x 256 on 2 SMs: ragged parts
    sas, sbs = GRANS[gran](M, N, K)
    prim = scaled_gemm(M, N, K, sas, sbs, True, False, T.float8_e4m3, T.float8_e4m3, T.bfloat16,
                       **WIDE)
    before = build_kernel(prim, target="hopper")
    target = HOPPER.replace(num_sms=2)
    after = lower(before, target)
    assert any(n.startswith("persist:") for n in after.notes)
    staging = _epilogue_staging(after)
    assert sorted(staging) == [(1,), (2,)], staging
    for names, waits in staging.values():
        assert len(set(names)) == 2 and waits == [1, 1], (names, waits)
    verify_async.run(after)
    a, b = fp8((M, K), E4M3, 111), fp8((N, K), E4M3, 112)
    sa, sb = positive(sas, 113), positive(sbs, 114)
    args = [a, sa, b, sb, torch.empty(M, N, dtype=torch.bfloat16)]
    want = run_interp(before, args, 4)
    for seed in range(10):
        assert torch.equal(run_interp(after, args, 4, seed), want), seed
    loosened = transform(after, lambda n: dataclasses.replace(n, outstanding=2)
                         if isinstance(n, ir.BulkStoreWait) and n.outstanding == 1 else None)
    with pytest.raises(CompileError, match="while the bulk store from line .* may still read it"):
        verify_async.run(loosened)
    need = SharedMemoryPlan.of(after.body).total_bytes
    for off in (target.replace(staging_per_store=False),
                target.replace(smem_bytes=need - 1)):
        shared = _epilogue_staging(lower(before, off))
        for names, waits in shared.values():
            assert len(set(names)) == 1 and waits == [0, 0], (names, waits)


@pytest.mark.parametrize("gran", ["row-2d", "block-t"])
def test_hopper_bias_is_added_by_each_consumer_in_its_epilogue(gran):
    """Warp-specialized and persistent with a bias: each consumer role reads the bias of its
    tile's columns after its k-loop (no producer load of it), the interpreter oracle agrees
    with the program before lowering over 10 schedules, and it compiles for sm_90a."""
    M, N, K = 384, 520, 304
    sas, sbs = GRANS[gran](M, N, K)
    prim = scaled_gemm_with_bias(M, N, K, sas, sbs, (N,), T.bfloat16, T.bfloat16,
                                 sa_t=gran == "block-t")
    before = build_kernel(prim, target="hopper")
    after = lower(before, HOPPER.replace(num_sms=2))
    assert after.find_plan(AsyncPlan) is not None
    program = gluon_program(after)
    assert program.asm["ttgir"].count("ttg.warp_specialize(") == 1
    consumers = re.findall(r"def main_ws\d\(.*?(?=\n(?:@gluon\.jit|def ))", program.source, re.S)
    reads = [body.count("gl.load(Bias +") for body in consumers]
    assert sorted(reads)[0] == 0 and sorted(reads)[-1] > 0, reads     # producer: none
    a, b = fp8((M, K), E4M3, 121), fp8((N, K), E4M3, 122)
    sa, sb = positive(sas, 123), positive(sbs, 124)
    bias = torch.randn(N).to(torch.bfloat16)
    args = [a, sa, b, sb, bias, torch.empty(M, N, dtype=torch.bfloat16)]
    want = run_interp(before, args, 5)
    for seed in range(10):
        assert torch.equal(run_interp(after, args, 5, seed), want), seed


@pytest.mark.parametrize("M, N, K", [(2, 1, 1), (3, 1, 100)])
def test_transposed_block_scales_where_the_shapes_also_read_as_per_row(M, N, K):
    """K <= 128 and N == 1: A_scale [1, M] (transposed block-wise) and B_scale [1, 1] also fit the
    per-row reading, which indexed A_scale as [M, 1] (rows past the first read nothing: 0, a
    wrong result without a word). ``transpose_A_scale=True`` means block-wise scales."""
    sas, sbs = GRANS["block-t"](M, N, K)
    sa, sb = spread(sas, 0, 0), spread(sbs, 0, 1)
    c, ref = run_gemm("interpret", M, N, K, "block-t", PAIRS["e4m3-e4m3"], False, torch.float32,
                      False, seed=0, scales=(sa, sb))
    assert rel_err(c, ref) < 1e-5


# ----------------------------------------------------------------------------------------------
# 10. split K (``splits``): slices summed in the kernel, scaled once (issue 41 item 4)


def split_call(kind, M, N, K, tiles, out_dtype, with_bias, target, seed=0):
    """The op's kernel with ``tiles`` (``target``), a NaN workspace and fresh counters: (out,
    the float64 reference, the counters after the call)."""
    a, w = fp8((M, K), E4M3, seed), fp8((N, K), E5M2, seed + 1)
    sa, sb = ops_scales(kind, M, N, K, seed + 2)
    args, operands = kernel_inputs(a, w.t(), sa, sb, out_dtype=out_dtype)
    bias_dtype = _T[out_dtype] if with_bias else None
    g = torch.Generator().manual_seed(seed + 3)
    bias = (torch.randn(N, generator=g) * 10).to(out_dtype) if with_bias else None
    kernel = fp8_ops.scaled_mm_kernel.fn
    prim = kernel(*args, tiles.hints(), bias_dtype=bias_dtype)
    counters = torch.zeros(cdiv(M, tiles.block_M) * cdiv(N, tiles.block_N) + 3, dtype=torch.int32)
    workspace = torch.full(fp8_language.split_workspace_shape(M, N, tiles.block_N, tiles.splits),
                           float("nan"))
    out = poisoned(M, N, dtype=out_dtype)
    k = tilews.compile(prim, target=target)
    k(*operands, *([bias] if with_bias else []), counters, workspace, out)
    return out, ops_reference(a, w.t(), sa, sb, kind, bias), counters


@pytest.mark.parametrize("target, kind, M, N, K, splits, out, with_bias", [
    ("interpret", "tensor", 20, 72, 600, 3, "bf16", False),     # 5 k-blocks: slices 2, 2, 1
    ("interpret", "row", 33, 100, 520, 2, "fp32", True),        # ragged M, N, K
    ("interpret", "tensor", 16, 64, 256, 4, "fp16", True),      # a slice past K: zeros
    ("triton", "row", 20, 72, 600, 3, "bf16", True),
    ("triton", "tensor", 40, 96, 384, 2, "fp32", False),
])
def test_split_k_matches_float64(target, kind, M, N, K, splits, out, with_bias):
    """Each slice's unscaled partial goes through a NaN workspace; the last block sums them,
    scales once, adds the bias, stores C and puts its counter back to zero."""
    tiles = fp8_ops.Tiles(16 if target == "interpret" else 32, 32, 2, 128, splits)
    got, want, counters = split_call(kind, M, N, K, tiles, OUTS[out], with_bias, target)
    assert not got.isnan().any()
    assert rel_err(got, want) < TOL[OUTS[out]]
    assert not counters.any()


def test_split_k_errors():
    a, w = fp8((16, 256), E4M3, 1), fp8((64, 256), E4M3, 2)
    sa, sb = ops_scales("block", 16, 64, 256, 3)
    args, _ = kernel_inputs(a, w.t(), sa, sb)
    split = fp8_ops.Tiles(64, 64, 2, 128, 2).hints()
    with pytest.raises(CompileValueError, match="per-tensor or per-row"):
        build_kernel(fp8_ops.scaled_mm_kernel.fn(*args, split))
    sa, sb = ops_scales("tensor", 16, 64, 256, 3)
    args, _ = kernel_inputs(a, w.t(), sa, sb)
    unsplit = build_kernel(fp8_ops.scaled_mm_kernel.fn(*args))
    assert [p.name for p in unsplit.params] == ["a", "scale_a", "b", "scale_b", "out"]
    split = build_kernel(fp8_ops.scaled_mm_kernel.fn(*args, split))
    assert [p.name for p in split.params] == ["a", "scale_a", "b", "scale_b", "arrival_slots",
                                              "arrivals", "workspace", "out"]

    expect_error(CompileValueError, split_without_workspace(),
                 marked_line(split_without_workspace, "# MARK"), "splits=2 needs workspace=", "[16, 128]")
    expect_error(CompileValueError, split_with_workspace((16, 64)),
                 marked_line(split_with_workspace, "# MARK"), "workspace is [16, 64]", "[16, 128]")
    expect_error(CompileTypeError, split_with_workspace((16, 128), T.float16),
                 marked_line(split_with_workspace, "# MARK"), "workspace is f16",
                 "a split's workspace must be float32")


def split_without_workspace():
    @T.prim_func
    def main(A: T.Tensor((16, 256), T.float8_e4m3), SA: T.Tensor((1,), T.float32),
             B: T.Tensor((64, 256), T.float8_e4m3), SB: T.Tensor((1,), T.float32),
             C: T.Tensor((16, 64), T.bfloat16)):
        T.fp8_scaled_matmul(A, SA, B, SB, C, transpose_B=True, splits=2)  # MARK
    return main


def split_with_workspace(w_shape, w_dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((16, 256), T.float8_e4m3), SA: T.Tensor((1,), T.float32),
             B: T.Tensor((64, 256), T.float8_e4m3), SB: T.Tensor((1,), T.float32),
             Arr: T.Tensor((8,), T.int32), W: T.Tensor(w_shape, w_dtype),
             C: T.Tensor((16, 64), T.bfloat16)):
        T.fp8_scaled_matmul(A, SA, B, SB, C, transpose_B=True, splits=2, block_N=64,  # MARK
                            workspace=W, arrivals=Arr)
    return main


@pytest.mark.parametrize("M, N, K, block_wise, want", [
    (16, 4096, 14336, False, "64x64 s12 t128 x2"),     # 64 tiles on 132 SMs, 112 k-blocks
    (64, 4096, 14336, False, "64x64 s12 t128 x2"),
    (1, 2048, 28672, False, "64x64 s12 t128 x4"),      # 32 tiles: at most SPLIT_MOST slices
    (16, 2048, 14336, False, "64x64 s12 t128 x2"),     # 112 k-blocks: 48 per slice at least
    (16, 4096, 4096, False, None),                     # 32 k-blocks: too short to split
    (64, 4096, 4096, False, None),
    (128, 4096, 14336, False, None),                   # 128 tiles of 64 x 64 fill the SMs
    (16, 14336, 14336, False, None),                   # 112 tiles of 64 x 128 fill them
    (16, 4096, 14336, True, None),                     # block-wise: scaled in the k-loop
])
def test_split_tiles_heuristic(M, N, K, block_wise, want):
    got = fp8_ops.split_tiles(M, N, K, block_wise, 132)
    assert (None if got is None else str(got)) == want


def test_split_tiles_text_and_default_off_the_gpu():
    t = fp8_ops.Tiles(64, 64, 12, 128, 2)
    assert str(t) == "64x64 s12 t128 x2" and fp8_ops.Tiles.from_text("64x64s12t128x2") == t
    assert dict(t.hints())["splits"] == 2 and "splits" not in dict(fp8_ops.Tiles(64, 64, 12, 128).hints())
    a, w = fp8((16, 4096), E4M3, 1), fp8((4096, 4096), E4M3, 2)
    args, _ = kernel_inputs(a, w.t(), torch.tensor(1.0), torch.tensor(1.0))
    assert fp8_ops.default_tiles(args, torch.device("cpu")) is None    # the interpreter's tiles


@pytest.mark.parametrize("with_bias", [False, True])
def test_ops_runs_a_split_tiling_with_its_scratch(fresh_fp8_calls, monkeypatch, with_bias):
    """The op's cached call gives a split kernel its counters and a workspace, first and later
    calls, with and without a bias (which goes before them)."""
    monkeypatch.setattr(fp8_ops, "default_tiles", lambda args, device, bias: fp8_ops.Tiles(16, 32, 2, 128, 3))
    M, N, K = 20, 72, 600
    for seed in (1, 2):
        a, w = fp8((M, K), E4M3, seed), fp8((N, K), E4M3, seed + 10)
        sa, sb = ops_scales("row", M, N, K, seed)
        bias = torch.randn(N, generator=torch.Generator().manual_seed(seed)) if with_bias else None
        c = fp8_scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=torch.float32)
        assert rel_err(c, ops_reference(a, w.t(), sa, sb, "row", bias)) < TOL[torch.float32]
    assert len(fp8_ops._calls) == 1


# ---- 11. swapped product of a few rows (swap_ab / transpose_C) ---------------------------------
@pytest.mark.parametrize("M, N, kinds, want", [
    (16, 4096, ("tensor", "tensor"), "64x16 s12 t128 swap"),
    (1, 64, ("tensor", "tensor"), "64x16 s12 t128 swap"),
    (32, 14336, ("tensor", "tensor"), "64x32 s16 t128 swap"),   # 224 tiles: kept up to 32 rows
    (33, 4096, ("tensor", "tensor"), "64x64 s12 t128 swap"),
    (128, 4096, ("tensor", "tensor"), "64x64 s12 t128 swap"),   # 128 tiles on 132 SMs
    (128, 4288, ("tensor", "tensor"), None),           # 134 tiles: more than one wave
    (64, 14336, ("tensor", "tensor"), None),
    (129, 4096, ("tensor", "tensor"), None),           # past SWAP_MOST_ROWS
    (16, 32, ("tensor", "tensor"), None),              # N fills no 64-row tile
    (16, 4096, ("row", "row"), None),                  # per-row scales would trade shapes too
])
def test_swap_tiles_rule(M, N, kinds, want):
    gran = Granularity(*(Scaling(k) for k in kinds))
    got = fp8_ops.swap_tiles(M, N, gran, num_sms=132)
    assert (None if got is None else str(got)) == want
    if got is not None:
        assert fp8_ops.Tiles.from_text(str(got).replace(" ", "")) == got
        assert dict(got.hints())["transpose_C"] is True and "swap_ab" not in dict(got.hints())


@pytest.mark.parametrize("M, N, K, out_dtype, splits", [
    (16, 96, 384, torch.bfloat16, 1), (5, 64, 200, torch.float32, 1), (20, 136, 256, torch.float16, 1),
    (20, 136, 640, torch.bfloat16, 2), (7, 200, 520, torch.float32, 3)])
def test_ops_runs_the_swapped_product(fresh_fp8_calls, monkeypatch, M, N, K, out_dtype, splits):
    """A swapped tiling: the kernel computes C^T = B A^T with the scales traded and stores C
    (contiguous, [M, N]) transposed; first and later calls, ragged M, N and K; split in K slices
    too (the workspace and counters are the kernel's, of the swapped shape)."""
    monkeypatch.setattr(fp8_ops, "default_tiles", lambda args, device, bias: fp8_ops.Tiles(
        64, 16, 2, 128, splits=splits, swap_ab=True))
    for seed in (3, 4):
        a, w = fp8((M, K), E4M3, seed), fp8((N, K), E4M3, seed + 10)
        sa, sb = ops_scales("tensor", M, N, K, seed)
        c = fp8_scaled_mm(a, w.t(), sa, sb, out_dtype=out_dtype)
        assert c.shape == (M, N) and c.is_contiguous() and c.dtype == out_dtype
        assert rel_err(c, ops_reference(a, w.t(), sa, sb, "tensor", None)) < TOL[out_dtype]
    assert len(fp8_ops._calls) == 1


@pytest.mark.parametrize("b_layout, a_layout, want", [
    ("col-major", "row-major", ["b.t()", "sb[None]", "a", "sa[None]"]),      # torch's weight: one view
    ("row-major", "row-major", ["b.t().contiguous()", "sb[None]", "a", "sa[None]"]),
    ("col-major", "col-major", ["b.t()", "sb[None]", "a.t()", "sa[None]"]),
])
def test_swapped_operands_make_only_the_views_they_need(b_layout, a_layout, want):
    """The swapped product's operands, from the caller's inputs: the transposes of the swap
    composed with the kernel's own (a K-major a is passed as it is, not as ``a.t().t()``); the
    same tensors as mapping the swapped inputs (b.t(), a.t(), sb, sa) step by step."""
    M, N, K = 20, 136, 256
    a = fp8((M, K), E4M3, 1)
    a = a if a_layout == "row-major" else a.t().contiguous().t()
    w = fp8((N, K), E4M3, 2)
    b = w.t() if b_layout == "col-major" else w.t().contiguous()
    sa, sb = ops_scales("tensor", M, N, K, 3)
    tiles = fp8_ops.Tiles(64, 16, 2, 128, swap_ab=True)
    args, operands = fp8_ops.tiled_kernel_mapping(tiles, a, b, sa, sb)
    assert operands.exprs() == want
    unswapped_args, step_by_step = fp8_ops.kernel_mapping(b.t(), a.t(), sb, sa)
    assert args == unswapped_args
    for got, ref in zip(operands(a, b, sa, sb), step_by_step(b.t(), a.t(), sb, sa), strict=True):
        assert (got.shape, got.stride(), got.dtype) == (ref.shape, ref.stride(), ref.dtype)
        assert torch.equal(got.float(), ref.float())
        assert (got.data_ptr() == ref.data_ptr()) == (ref.data_ptr() in (a.data_ptr(), b.data_ptr(),
                                                                         sa.data_ptr(), sb.data_ptr()))


def test_ops_cached_calls_of_several_kinds_each_take_their_own_path(fresh_fp8_calls, monkeypatch):
    """Calls of different kinds, interleaved, each kept once and found again: a bias or none, a
    bias converted per call (float64) or taken as it is, b row-major or column-major, b in
    float8_e5m2, a float32 result, 0-d or [1] scales; swapped and not (a swapped tiling where
    the scales are per tensor, as on Hopper). Each call's result is its own kind's."""
    M, N, K = 20, 136, 256
    swapped = fp8_ops.Tiles(64, 16, 2, 128, swap_ab=True)
    chosen = []

    def tiles_of(args, device, bias):               # as on Hopper: swapped where per tensor
        chosen.append(None if bias or args[3:5] != ((1,), (1,)) else swapped)
        return chosen[-1]
    monkeypatch.setattr(fp8_ops, "default_tiles", tiles_of)
    g = torch.Generator().manual_seed(9)
    bias = torch.randn(N, generator=g, dtype=torch.float64) * 10
    kinds = [dict(), dict(bias=bias.bfloat16()), dict(bias=bias), dict(b="row-major"),
             dict(b_dtype=E5M2), dict(out_dtype=torch.float32), dict(scales="[1]"),
             dict(scales="row"), dict(scales="row", bias=bias.float(), out_dtype=torch.float32)]
    for seed in (0, 1):
        for n, kind in enumerate(kinds):
            a, w = fp8((M, K), E4M3, 10 * seed + n), fp8((N, K), kind.get("b_dtype", E4M3), 50 + n)
            b = w.t().contiguous() if kind.get("b") == "row-major" else w.t()
            sa, sb = ops_scales("row" if kind.get("scales") == "row" else "tensor", M, N, K, seed + n)
            if kind.get("scales") == "[1]":
                sa, sb = sa.reshape(1), sb.reshape(1)
            out_dtype = kind.get("out_dtype", torch.bfloat16)
            c = fp8_scaled_mm(a, b, sa, sb, bias=kind.get("bias"), out_dtype=out_dtype)
            assert c.shape == (M, N) and c.dtype == out_dtype
            want = ops_reference(a, b, sa, sb, "row" if kind.get("scales") == "row" else "tensor",
                                 kind.get("bias"))
            assert rel_err(c, want) < TOL[out_dtype], kind
    assert len(fp8_ops._calls) == len(kinds) and chosen.count(swapped) == 5


def transposed_c_program(c_shape, flag):
    @T.prim_func
    def main(A: T.Tensor((64, 128), T.float8_e4m3), SA: T.Tensor((1,), T.float32),
             B: T.Tensor((16, 128), T.float8_e4m3), SB: T.Tensor((1,), T.float32),
             C: T.Tensor(c_shape, T.bfloat16)):
        T.fp8_scaled_matmul(A, SA, B, SB, C, transpose_B=True, transpose_C=flag)  # <- the call
    return main


@pytest.mark.parametrize("c_shape, flag, error, message", [
    ((64, 16), True, CompileValueError, r"C is \[64, 16\], not \[N, M\] = \[16, 64\] \(transpose_C=True\)"),
    ((16, 64), 1, CompileTypeError, "transpose_C must be a bool, got 1"),
])
def test_transpose_c_errors_name_the_users_line(c_shape, flag, error, message):
    with pytest.raises(error, match=message) as info:
        tilews.compile(transposed_c_program(c_shape, flag), target="interpret")
    assert info.value.loc.line == marked_line(transposed_c_program, "# <- the call")


def test_hopper_swapped_product_stays_warp_specialized():
    """sm_90a: the swapped 16-row product is the warp-specialized FP8 kernel (TMA ring, wgmma
    with the promotion overlapped) storing C by element, transposed; no spills."""
    a = torch.empty(16, 4096, dtype=E4M3, device="meta")
    w = torch.empty(4096, 4096, dtype=E4M3, device="meta")
    tiles = fp8_ops.swap_tiles(16, 4096, num_sms=132, gran=fp8_ops._granularity(fp8_ops.kernel_mapping(
        a, w.t(), torch.empty((), device="meta"), torch.empty((), device="meta"))[0]))
    args, _ = fp8_ops.tiled_kernel_mapping(tiles, a, w.t(), torch.empty((), device="meta"),
                                           torch.empty((), device="meta"))
    assert args[:3] == (4096, 16, 4096)
    k = lower(build_kernel(fp8_ops.scaled_mm_kernel.fn(*args, tiles.hints()), target="hopper"),
              HOPPER.replace(num_sms=132))
    assert any(n.startswith("warp_specialize:") for n in k.notes)
    p = gluon_program(k)
    ptx = p.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
    assert unwaited_global_accesses(ptx) == []      # TMA loads, scale loads, C's stores: all after the wait
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this triton has no bundled ptxas")
    assert "C7514" not in report and "0 bytes spill stores" in report, report


def test_hopper_split_k_sums_in_the_kernel():
    """sm_90a: the split kernel is one launch over (tiles, slices): the partial stored from
    registers, an acq_rel arrival, the sum and one scaling under the last arrival; the k-loop
    runs K / 128 / splits iterations; ptxas neither spills nor serializes the wgmmas."""
    a = torch.empty(16, 4096, dtype=E4M3, device="meta")
    w = torch.empty(4096, 4096, dtype=E4M3, device="meta")
    args, _ = fp8_ops.kernel_mapping(a, w.t(), torch.empty((), device="meta"),
                                     torch.empty((), device="meta"))
    hints = fp8_ops.Tiles(64, 64, 12, 128, 2).hints()
    k = lower(build_kernel(fp8_ops.scaled_mm_kernel.fn(*args, hints), target="hopper"),
              HOPPER.replace(num_sms=132))
    p = gluon_program(k)
    src = p.source
    assert "bz = gl.program_id(2)" in src and "for k in range(0, 16, 1):" in src
    assert src.count("sem='acq_rel'") == 1 and src.count("scale_a +") == 1
    ptx = p.asm["ptx"]
    assert re.search(r"atom\.[a-z_.]*acq_rel", ptx), "no acq_rel atomic in the PTX"
    assert unwaited_global_accesses(ptx) == []      # the atomic and the partials' sum as well
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this triton has no bundled ptxas")
    assert "C7514" not in report and "0 bytes spill stores" in report, report


# ----------------------------------------------------------------------------------------------
# 12. the promotion under the next k-block's wgmma (overlap_promotion, issue 41 item 4)


def _hopper_kernels(kind, M, N, K, tiles, config):
    """(before, after the passes of ``config``) of the op's kernel for a K-major M x N x K product
    with ``kind`` scales and ``tiles``, built for ``hopper`` on meta tensors."""
    a = torch.empty(M, K, dtype=E4M3, device="meta")
    w = torch.empty(N, K, dtype=E4M3, device="meta")
    sa, sb = ((torch.empty((), device="meta"),) * 2 if kind == "tensor" else
              (torch.empty(M, 1, device="meta"), torch.empty(1, N, device="meta")))
    args, _ = fp8_ops.kernel_mapping(a, w.t(), sa, sb)
    before = build_kernel(fp8_ops.scaled_mm_kernel.fn(*args, tiles.hints()), target="hopper")
    return before, lower(before, config)


@pytest.mark.parametrize("kind, K, tiles", [
    ("tensor", 1024, fp8_ops.Tiles(64, 64, 12, 128)),      # 8 k-blocks: 1 + 3 x 2 + 1
    ("row", 896, fp8_ops.Tiles(64, 64, 12, 128)),         # 7: 1 + 3 x 2
    ("tensor", 1152, fp8_ops.Tiles(128, 128, 5, 256)),    # 9, one role per warp group
    ("row", 1280, fp8_ops.Tiles(64, 64, 12, 128, 2)),     # split: slices of 5
])
def test_promotion_runs_under_the_next_wgmma(kind, K, tiles):
    """Per-tensor / per-row promotion: each role's k-loop issues k-block k's wgmma into one of
    two partial fragments, waits with one wgmma in flight (the previous k-block's complete) and
    adds that one into the sum; nothing is in flight at the loop's back edge. The lowered kernel
    gives the before-passes result in the interpreter (20 schedules), and that one float64's."""
    M, N = 64, 256
    config = HOPPER.replace(num_sms=132)
    before, after = _hopper_kernels(kind, M, N, K, tiles, config)
    _, serial = _hopper_kernels(kind, M, N, K, tiles, config.replace(overlap_promotion=False))
    consumers = [r for ws in walk(after.body) if isinstance(ws, ir.WarpSpecialize)
                 for r in ws.roles if r.warpgroups != (0,)]
    assert len(consumers) == tiles.block_M // 64
    for role in consumers:
        waits = [s.outstanding for s in walk(role.body) if isinstance(s, ir.GemmWait)]
        gemms = {s.c.buffer.name for s in walk(role.body) if isinstance(s, ir.Gemm)}
        assert len(gemms) == 2 and 1 in waits, (gemms, waits)
        loop = next(s for s in role.body.stmts if isinstance(s, ir.For))
        assert isinstance(loop.body.stmts[-1], ir.GemmWait) and loop.body.stmts[-1].outstanding == 0
    serial_waits = [s.outstanding for s in walk(serial.body) if isinstance(s, ir.GemmWait)]
    assert serial_waits and set(serial_waits) == {0}, serial_waits
    a, w = fp8((M, K), E4M3, 7), fp8((N, K), E4M3, 8)
    sa, sb = ops_scales(kind, M, N, K, 9)
    _, operands = kernel_inputs(a, w.t(), sa, sb)
    counters = torch.zeros(cdiv(M, tiles.block_M) * cdiv(N, tiles.block_N), dtype=torch.int32)
    scratch = [] if tiles.splits == 1 else [  # arrival_slots, arrivals, a NaN workspace
        counters.numel(), counters,
        torch.full(fp8_language.split_workspace_shape(M, N, tiles.block_N, tiles.splits), float("nan"))]
    args = [*operands, *scratch, torch.empty(M, N, dtype=torch.bfloat16)]
    want = run_interp(before, args, len(args) - 1)
    assert rel_err(want, ops_reference(a, w.t(), sa, sb, kind, None)) < TOL[torch.bfloat16]
    assert not counters.any()
    for seed in range(20):
        assert torch.equal(run_interp(after, args, len(args) - 1, seed), want), seed


@pytest.mark.parametrize("kind, tiles", [
    ("tensor", fp8_ops.Tiles(64, 64, 12, 128)), ("row", fp8_ops.Tiles(64, 128, 8, 128)),
    ("tensor", fp8_ops.Tiles(128, 128, 5, 256)), ("row", fp8_ops.Tiles(128, 256, 3, 256))])
def test_compiled_promotion_keeps_a_wgmma_in_flight(kind, tiles):
    """sm_90a, 64 / 128 x 4096 x 4096: a k-block's wgmma waited for with the next one in flight
    (``wgmma.wait_group 1``); ptxas neither serializes the wgmmas (C7514) nor spills. 128 x 256
    tiles promote two 128-column parts per k-block through one partial (a second would not fit
    the registers): left as written, every wait a wait 0."""
    _, k = _hopper_kernels(kind, 64 if tiles.block_M == 64 else 128, 4096, 4096, tiles,
                           HOPPER.replace(num_sms=132))
    ptx = gluon_program(k).asm["ptx"]
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d)", ptx)
    if tiles.block_N == 256:
        assert set(waits) == {"0"}, waits
    else:
        assert "1" in waits, waits
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this triton has no bundled ptxas")
    assert "C7514" not in report and "0 bytes spill stores" in report, report
