"""tilews.metal.harness: hand-written MSL (the subset of metal-contract.md) run on the CPU.

Every numeric test uses random inputs, poisons outputs with NaN, and compares with numpy float64 at a
stated tolerance. The planted-bug tests show that each class of bug the harness exists to catch is
caught: a wrong ulong2 origin order (numbers), a missing barrier (ThreadSanitizer; and NaN from the
poisoned threadgroup memory), an out-of-bounds write (AddressSanitizer), divergent simdgroup
operations and barriers, more than 32 KB of threadgroup memory, and an output never written.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest
import torch

from tilews.cache import default_cache_dir
from tilews.metal import harness
from tilews.metal.harness import HarnessError, HarnessUnavailable
from tilews.metal.source import MslKernel, MslParam

needs_cxx = pytest.mark.skipif(harness.compiler() is None, reason="needs g++ or clang++")

POS, TID = "threadgroup_position_in_grid", "thread_index_in_threadgroup"
SG, LANE = "simdgroup_index_in_threadgroup", "thread_index_in_simdgroup"
NUMPY = {"float": np.float32, "half": np.float16, "bfloat": ml_dtypes.bfloat16}


def check(actual, expected, rtol, atol):
    """Every element written (the output started as NaN) and |actual - expected| <= atol +
    rtol * |expected| elementwise (atol may be an array)."""
    actual = np.asarray(torch.as_tensor(actual).float() if isinstance(actual, torch.Tensor) else actual,
                        dtype=np.float64)
    unwritten = np.argwhere(np.isnan(actual))
    assert unwritten.size == 0, f"{len(unwritten)} elements never written, first at {unwritten[0].tolist()}"
    expected = np.asarray(expected, dtype=np.float64)
    error = np.abs(actual - expected)
    bad = np.argwhere(error > atol + rtol * np.abs(expected))
    assert bad.size == 0, (f"{len(bad)} of {actual.size} elements off, first at {bad[0].tolist()}: "
                           f"{actual[tuple(bad[0])]} vs {expected[tuple(bad[0])]}")


def sanitized(kernel: MslKernel, sanitizer: str | None) -> harness.HarnessKernel:
    try:
        return harness.build(kernel, sanitizer=sanitizer)
    except HarnessUnavailable as error:
        pytest.skip(str(error))


# ---- kernels ------------------------------------------------------------------------------------

def elementwise(store_check: bool = True) -> MslKernel:
    """out = exp(x) * alpha + y over an M x N matrix, in 16 x 16 tiles of 256 threads. Without
    store_check, lanes outside the matrix still store (the loads stay guarded)."""
    store = "if (inside) " if store_check else ""
    body = f"""
  const uint i = threadgroup_position_in_grid.y * 16u + thread_index_in_threadgroup / 16u;
  const uint j = threadgroup_position_in_grid.x * 16u + thread_index_in_threadgroup % 16u;
  const bool inside = i < M[0] && j < N[0];
  const float v = inside ? exp(x[i * N[0] + j]) * alpha[0] + y[i * N[0] + j] : 0.0f;
  {store}out[i * N[0] + j] = v;
"""
    params = (MslParam("x", "half", False), MslParam("y", "float", False), MslParam("out", "float", True),
              MslParam("alpha", "float", False, scalar=True), MslParam("M", "uint", False, scalar=True),
              MslParam("N", "uint", False, scalar=True))
    return MslKernel("elementwise" if store_check else "elementwise_unguarded", "", body, params,
                     (POS, TID), 256)


def row_reduce(write_max: bool = True) -> MslKernel:
    """Row sums and maxima: strided partials, simd_sum/simd_max, then 4 simdgroups via threadgroup
    memory and a barrier. One threadgroup of 128 threads per row."""
    store_max = "maxes[row] = m;" if write_max else ""
    body = f"""
  threadgroup float part_sum[4];
  threadgroup float part_max[4];
  const uint row = threadgroup_position_in_grid.x;
  float s = 0.0f, m = -INFINITY;
  for (uint c = thread_index_in_threadgroup; c < cols[0]; c += 128u) {{
    const float v = X[row * cols[0] + c];
    s += v;
    m = max(m, v);
  }}
  s = simd_sum(s);
  m = simd_max(m);
  if (thread_index_in_simdgroup == 0u) {{
    part_sum[simdgroup_index_in_threadgroup] = s;
    part_max[simdgroup_index_in_threadgroup] = m;
  }}
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (thread_index_in_threadgroup == 0u) {{
    s = 0.0f;
    m = -INFINITY;
    for (uint i = 0; i < 4u; ++i) {{
      s += part_sum[i];
      m = max(m, part_max[i]);
    }}
    sums[row] = s;
    {store_max}
  }}
"""
    params = (MslParam("X", "float", False), MslParam("sums", "float", True),
              MslParam("maxes", "float", True, read=False), MslParam("cols", "uint", False, scalar=True))
    return MslKernel("row_reduce" if write_max else "row_reduce_forgets_max", "", body, params,
                     (POS, TID, SG, LANE), 128)


SIMD_OPS = MslKernel("simd_ops", "", """
  const uint t = thread_index_in_threadgroup;
  float v = x[t];
  float butterfly = v;
  for (ushort mask = 16; mask > 0; mask >>= 1) butterfly += simd_shuffle_xor(butterfly, mask);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  xor_sum[t] = butterfly;
  from_lane5[t] = simd_broadcast(v, 5);
  lowest[t] = simd_min(k[t]);
  half_sum[t] = simd_sum(half(v));
""", (MslParam("x", "float", False), MslParam("k", "int", False), MslParam("xor_sum", "float", True),
      MslParam("from_lane5", "float", True), MslParam("lowest", "int", True),
      MslParam("half_sum", "half", True)), (TID,), 64)


def origin(col: str, row: str, order: str) -> str:
    return f"ulong2({col}, {row})" if order == "col_row" else f"ulong2({row}, {col})"


def gemm_16(dtype: str, trans_b: bool, order: str = "col_row") -> MslKernel:
    """C (16 x 16, float) = A (16 x 16) @ B, B given as K x N or (trans_b) N x K; one simdgroup,
    simdgroup_load straight from device memory, float accumulators."""
    b_load = (f"simdgroup_load(b[j], B, 16, {origin('k', 'j * 8u', order)}, true);" if trans_b else
              f"simdgroup_load(b[j], B, 16, {origin('j * 8u', 'k', order)});")
    body = f"""
  simdgroup_float8x8 acc[4];
  for (uint t = 0; t < 4u; ++t) acc[t] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  for (uint k = 0; k < 16u; k += 8u) {{
    simdgroup_matrix<{dtype}, 8, 8> a[2], b[2];
    for (uint i = 0; i < 2u; ++i) simdgroup_load(a[i], A, 16, {origin('k', 'i * 8u', order)}, false);
    for (uint j = 0; j < 2u; ++j) {b_load}
    for (uint i = 0; i < 2u; ++i)
      for (uint j = 0; j < 2u; ++j) simdgroup_multiply_accumulate(acc[i * 2u + j], a[i], b[j], acc[i * 2u + j]);
  }}
  for (uint i = 0; i < 2u; ++i)
    for (uint j = 0; j < 2u; ++j) simdgroup_store(acc[i * 2u + j], C, 16, {origin('j * 8u', 'i * 8u', order)});
"""
    params = (MslParam("A", dtype, False), MslParam("B", dtype, False), MslParam("C", "float", True))
    return MslKernel(f"gemm16_{dtype}_{'nt' if trans_b else 'nn'}_{order}", "", body, params, (), 32)


def gemm_tiled(dtype: str, size: int, block: int, trans_b: bool, first_barrier: bool = True) -> MslKernel:
    """C (size^2, float) = A @ B (B as N x K if trans_b) in block x block tiles of 4 simdgroups (2 x 2)
    staged through threadgroup memory in steps of 16 along K; grid (size/block, size/block)."""
    per_sg = block // 2 // 8           # 8x8 tiles per simdgroup along M and along N
    if trans_b:
        b_fill = f"Bs[e] = B[(n0 + e / 16u) * {size}u + k0 + e % 16u];"
        b_load = f"simdgroup_load(b[j], Bs, 16, ulong2(kk, (sn * {per_sg}u + j) * 8u), true);"
    else:
        b_fill = f"Bs[e] = B[(k0 + e / {block}u) * {size}u + n0 + e % {block}u];"
        b_load = f"simdgroup_load(b[j], Bs, {block}, ulong2((sn * {per_sg}u + j) * 8u, kk), false);"
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);" if first_barrier else ""
    body = f"""
  threadgroup {dtype} As[{block * 16}];
  threadgroup {dtype} Bs[{block * 16}];
  const uint tid = thread_index_in_threadgroup;
  const uint m0 = threadgroup_position_in_grid.y * {block}u, n0 = threadgroup_position_in_grid.x * {block}u;
  const uint sm = simdgroup_index_in_threadgroup / 2u, sn = simdgroup_index_in_threadgroup % 2u;
  simdgroup_float8x8 acc[{per_sg * per_sg}];
  for (uint t = 0; t < {per_sg * per_sg}u; ++t) acc[t] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  for (uint k0 = 0; k0 < {size}u; k0 += 16u) {{
    for (uint e = tid; e < {block * 16}u; e += 128u) As[e] = A[(m0 + e / 16u) * {size}u + k0 + e % 16u];
    for (uint e = tid; e < {block * 16}u; e += 128u) {b_fill}
    {barrier}
    for (uint kk = 0; kk < 16u; kk += 8u) {{
      simdgroup_matrix<{dtype}, 8, 8> a[{per_sg}], b[{per_sg}];
      for (uint i = 0; i < {per_sg}u; ++i) simdgroup_load(a[i], As, 16, ulong2(kk, (sm * {per_sg}u + i) * 8u));
      for (uint j = 0; j < {per_sg}u; ++j) {b_load}
      for (uint i = 0; i < {per_sg}u; ++i)
        for (uint j = 0; j < {per_sg}u; ++j)
          simdgroup_multiply_accumulate(acc[i * {per_sg}u + j], a[i], b[j], acc[i * {per_sg}u + j]);
    }}
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }}
  for (uint i = 0; i < {per_sg}u; ++i)
    for (uint j = 0; j < {per_sg}u; ++j)
      simdgroup_store(acc[i * {per_sg}u + j], C, {size},
                      ulong2(n0 + (sn * {per_sg}u + j) * 8u, m0 + (sm * {per_sg}u + i) * 8u));
"""
    params = (MslParam("A", dtype, False), MslParam("B", dtype, False), MslParam("C", "float", True))
    name = f"gemm{size}_{dtype}_b{block}_{'nt' if trans_b else 'nn'}{'' if first_barrier else '_nobarrier'}"
    return MslKernel(name, "", body, params, (POS, TID, SG), 128)


def gemm_operands(dtype: str, size: int, trans_b: bool, seed: int):
    """Random operands rounded to dtype, the float64 reference, and a NaN-poisoned C."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((size, size)).astype(NUMPY[dtype])
    b = rng.standard_normal((size, size)).astype(NUMPY[dtype])
    b_kn = b.astype(np.float64).T if trans_b else b.astype(np.float64)
    reference = a.astype(np.float64) @ b_kn
    return a, b, np.full((size, size), np.nan, np.float32), reference


# Products of half/bfloat operands are exact in float; what remains is float accumulation over K.
GEMM_TOL = dict(rtol=1e-5, atol=1e-4)


# ---- numbers ------------------------------------------------------------------------------------

@needs_cxx
def test_elementwise_with_ragged_bounds():
    m, n = 37, 53                           # neither a multiple of the 16 x 16 tile
    rng = np.random.default_rng(1)
    x = rng.standard_normal((m, n)).astype(np.float16)
    y = rng.standard_normal((m, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    harness.build(elementwise()).run([x, y, out, 0.75, m, n], (4, 3, 1))
    e = np.exp(x.astype(np.float64))       # exp of a half is a half in MSL: one rounding, 2^-11
    check(out, e * 0.75 + y, rtol=0, atol=e * 0.75 * 2.0**-11 + 1e-6)


@needs_cxx
def test_a_launch_leaves_no_lane_stacks_mapped():
    """Each loaded kernel library has its own lane stacks, split by guard pages into a mapping per
    lane: kept after a launch, a few hundred kernels in one process (a fuzz run) exhausted the
    process's map count (vm.max_map_count) and later loads failed or crashed."""
    def mappings():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    m, n = 16, 16
    x = np.ones((m, n), np.float16)
    y = np.ones((m, n), np.float32)
    out = np.full((m, n), np.nan, np.float32)
    kernel = harness.build(elementwise())
    before = mappings()
    kernel.run([x, y, out, 0.5, m, n], (1, 1, 1))      # loads the library: a few mappings
    assert mappings() - before < 64                    # 256 lanes' stacks would leave 512
    check(out, np.full((m, n), np.e * 0.5 + 1), rtol=1e-3, atol=0)


@needs_cxx
def test_threadgroup_reduction_with_barrier_and_simd_sum():
    rows, cols = 5, 1000
    x = np.random.default_rng(2).standard_normal((rows, cols)).astype(np.float32)
    sums = np.full(rows, np.nan, np.float32)
    maxes = np.full(rows, np.nan, np.float32)
    harness.build(row_reduce()).run([x, sums, maxes, cols], (rows, 1, 1))
    check(sums, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    check(maxes, x.max(axis=1), rtol=0, atol=0)


@needs_cxx
@pytest.mark.parametrize("sanitizer", [None, "address"])   # fibers, and one OS thread per lane
def test_simd_shuffle_broadcast_min_and_half_sum(sanitizer):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(64).astype(np.float32)
    k = rng.integers(-1000, 1000, 64).astype(np.int32)
    outs = [np.full(64, np.nan, np.float32), np.full(64, np.nan, np.float32), np.zeros(64, np.int32),
            np.full(64, np.nan, np.float16)]
    sanitized(SIMD_OPS, sanitizer).run([x, k, *outs], (1, 1, 1))
    groups = x.astype(np.float64).reshape(2, 32)
    check(outs[0], np.repeat(groups.sum(axis=1), 32), rtol=1e-5, atol=1e-5)
    check(outs[1], np.repeat(groups[:, 5], 32), rtol=0, atol=0)
    np.testing.assert_array_equal(outs[2], np.repeat(k.reshape(2, 32).min(axis=1), 32))
    halves = x.astype(np.float16).astype(np.float64).reshape(2, 32)
    check(outs[3], np.repeat(halves.sum(axis=1), 32), rtol=2e-3, atol=2e-3)   # one rounding to half


@needs_cxx
@pytest.mark.parametrize("trans_b", [False, True], ids=["nn", "nt"])
@pytest.mark.parametrize("dtype", ["float", "half", "bfloat"])
def test_simdgroup_gemm_16(dtype, trans_b):
    a, b, c, reference = gemm_operands(dtype, 16, trans_b, seed=4)
    if dtype == "bfloat":   # bfloat through torch tensors, the others through numpy
        a, b = (torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16) for v in (a, b))
    harness.build(gemm_16(dtype, trans_b)).run([a, b, c], (1, 1, 1))
    check(c, reference, **GEMM_TOL)


@needs_cxx
@pytest.mark.parametrize("dtype,trans_b", [("float", False), ("half", True), ("bfloat", True)])
def test_simdgroup_gemm_32_with_4_simdgroups_via_threadgroup_memory(dtype, trans_b):
    a, b, c, reference = gemm_operands(dtype, 32, trans_b, seed=5)
    harness.build(gemm_tiled(dtype, 32, 32, trans_b)).run([a, b, c], (1, 1, 1))
    check(c, reference, **GEMM_TOL)


@needs_cxx
def test_gemm_64_half_runs_fast():
    a, b, c, reference = gemm_operands("half", 64, True, seed=6)
    kernel = harness.build(gemm_tiled("half", 64, 16, True))   # 16 threadgroups of 128 lanes
    start = time.perf_counter()
    kernel.run([a, b, c], (4, 4, 1))
    seconds = time.perf_counter() - start
    check(c, reference, **GEMM_TOL)
    assert seconds < 2.0, f"64x64x64 half GEMM took {seconds:.2f} s"


@needs_cxx
def test_bfloat_rounds_to_nearest_even():
    kernel = MslKernel("to_bfloat", "", """
  const uint t = thread_index_in_threadgroup;
  const bfloat b = bfloat(x[t]);
  bits[t] = as_type<ushort>(b);
  back[t] = float(b) * 1.0f;
""", (MslParam("x", "float", False), MslParam("bits", "ushort", True), MslParam("back", "float", True)),
        (TID,), 64)
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F80C000, 0x7F7FFFFF, 0x7FC00001,
                     0x7F800000, 0x00008000], np.uint32).view(np.float32)
    x = np.concatenate([ties, np.random.default_rng(7).standard_normal(56).astype(np.float32)])
    bits = np.zeros(64, np.uint16)
    back = np.full(64, np.nan, np.float32)
    harness.build(kernel).run([x, bits, back], (1, 1, 1))
    expected = x.astype(ml_dtypes.bfloat16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(bits[finite], expected.view(np.uint16)[finite])
    assert np.isnan(back[~finite]).all()
    np.testing.assert_array_equal(back[finite], expected.astype(np.float32)[finite])


@needs_cxx
@pytest.mark.parametrize("sanitizer", [None, "address"])
def test_device_atomics_across_threadgroups(sanitizer):
    kernel = MslKernel("atomics", "", """
  const uint i = threadgroup_position_in_grid.x * 64u + thread_index_in_threadgroup;
  if (i >= n[0]) return;
  atomic_fetch_add_explicit((device atomic_float*)total, x[i], memory_order_relaxed);
  atomic_fetch_add_explicit((device atomic_int*)count, 1, memory_order_relaxed);
""", (MslParam("x", "float", False), MslParam("total", "float", True), MslParam("count", "int", True),
      MslParam("n", "uint", False, scalar=True)), (POS, TID), 64)
    x = np.random.default_rng(8).standard_normal(300).astype(np.float32)
    total, count = np.zeros(1, np.float32), np.zeros(1, np.int32)
    sanitized(kernel, sanitizer).run([x, total, count, 300], (5, 1, 1))
    assert count[0] == 300
    check(total, [x.astype(np.float64).sum()], rtol=1e-5, atol=1e-4)


MATH = MslKernel("math_and_types", "inline float twice(float v) { return v * 2.0f; }\n", """
  const uint t = thread_index_in_threadgroup;
  const float v = x[t];
  const half h = half(v);
  float r[12];
  r[0] = metal::exp(v);
  r[1] = exp2(v);
  r[2] = log(v);
  r[3] = metal::log2(v);
  r[4] = sqrt(v);
  r[5] = rsqrt(v);
  r[6] = fabs(-v) + abs(-v);
  r[7] = floor(v * 3.0f) + ceil(v * 3.0f);
  r[8] = pow(v, 1.5f);
  r[9] = fmax(v, 1.0f) + fmin(v, 1.0f) + max(v, 1.0f) * min(v, 1.0f);
  r[10] = select(v, -v, v > 1.0f) + (t % 2u == 0u ? INFINITY : -INFINITY);
  r[11] = twice(float(metal::exp(h)) + float(max(h, half(1.0f))) + float(abs(-h)));
  for (uint i = 0; i < 12u; ++i) out[t * 12u + i] = r[i];
  threadgroup_barrier(mem_flags::mem_device);
  const int k = ks[t];
  ints[t * 4u + 0u] = abs(k) + max(k, -5) + min(k, 5);
  ints[t * 4u + 1u] = static_cast<int>(as_type<uint>(v) >> 23);
  ints[t * 4u + 2u] = simd_sum(k);
  ints[t * 4u + 3u] = int(simd_sum(uint(t)) + min(uint(t), 7u)) + int(big[0] / 1000000000l) + s16[0] + c8[0]
                      + (flag[0] ? 1 : 0) + int(ubig[0] >> 40);
""", (MslParam("x", "float", False), MslParam("ks", "int", False), MslParam("out", "float", True),
      MslParam("ints", "int", True), MslParam("big", "long", False, scalar=True),
      MslParam("ubig", "ulong", False, scalar=True), MslParam("s16", "short", False, scalar=True),
      MslParam("c8", "char", False, scalar=True), MslParam("flag", "bool", False, scalar=True)), (TID,), 48)


@needs_cxx
def test_math_scalars_and_a_partial_simdgroup():
    """The math, casts and scalar types of the contract; 48 threads: simdgroup 1 has 16 lanes."""
    rng = np.random.default_rng(13)
    x = rng.uniform(0.5, 2.0, 48).astype(np.float32)
    ks = rng.integers(-50, 50, 48).astype(np.int32)
    out = np.full(48 * 12, np.nan, np.float32)
    ints = np.zeros(48 * 4, np.int32)
    harness.build(MATH).run([x, ks, out, ints, -7 * 10**9, 3 << 40, -300, -5, True], (1, 1, 1))
    v = x.astype(np.float64)
    h = x.astype(np.float16).astype(np.float64)
    inf = np.where(np.arange(48) % 2 == 0, np.inf, -np.inf)
    expected = np.stack([np.exp(v), np.exp2(v), np.log(v), np.log2(v), np.sqrt(v), 1 / np.sqrt(v), 2 * v,
                         np.floor(3 * x) + np.ceil(3 * x), v ** 1.5,
                         np.maximum(v, 1) + np.minimum(v, 1) + np.maximum(v, 1) * np.minimum(v, 1),
                         np.where(v > 1, -v, v) + inf, 2 * (np.exp(h) + np.maximum(h, 1) + h)], axis=1)
    tolerance = np.full((48, 12), 1e-6)
    tolerance[:, 11] = 2 * np.exp(h) * 2.0**-11 + 1e-6    # exp of a half is a half
    finite = np.isfinite(expected)
    actual = out.reshape(48, 12)
    assert (actual[~finite] == expected[~finite]).all()
    check(actual[finite], expected[finite], rtol=1e-6, atol=tolerance[finite])
    lanes = np.arange(48)
    per_simdgroup = np.where(lanes < 32, ks[:32].sum(), ks[32:].sum())
    lane_sums = np.where(lanes < 32, lanes[:32].sum(), lanes[32:].sum())
    np.testing.assert_array_equal(ints.reshape(48, 4), np.stack([
        np.abs(ks) + np.maximum(ks, -5) + np.minimum(ks, 5), x.view(np.uint32) >> 23, per_simdgroup,
        lane_sums + np.minimum(lanes, 7) - 7 - 300 - 5 + 1 + 3], axis=1))


@needs_cxx
@pytest.mark.parametrize("dtype", ["half", "bfloat"])
def test_simdgroup_multiply_accumulate_with_same_type_accumulators(dtype):
    """c and d of the operand type (llama.cpp also uses this form): rounded once per call."""
    kernel = MslKernel(f"mma_{dtype}_acc", "", f"""
  simdgroup_matrix<{dtype}, 8, 8> a, b, acc = make_filled_simdgroup_matrix<{dtype}, 8, 8>(0.0f);
  for (uint k = 0; k < 32u; k += 8u) {{
    simdgroup_load(a, A + k, 32);
    simdgroup_load(b, B, 8, ulong2(0, k));
    simdgroup_multiply_accumulate(acc, a, b, acc);
  }}
  simdgroup_store(acc, C, 8, ulong2(0, 0), true);
""", (MslParam("A", dtype, False), MslParam("B", dtype, False), MslParam("C", dtype, True)), (), 32)
    rng = np.random.default_rng(14)
    a = rng.standard_normal((8, 32)).astype(NUMPY[dtype])
    b = rng.standard_normal((32, 8)).astype(NUMPY[dtype])
    c = np.full((8, 8), np.nan, NUMPY[dtype])
    harness.build(kernel).run([a, b, c], (1, 1, 1))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    unit = 2.0**-11 if dtype == "half" else 2.0**-8      # relative rounding of the type
    # four roundings of partial sums bounded by |a| @ |b|, stored transposed
    check(c.astype(np.float32), (a64 @ b64).T, rtol=0, atol=4 * unit * (np.abs(a64) @ np.abs(b64)).T)


# ---- planted bugs ---------------------------------------------------------------------------------

@needs_cxx
def test_wrong_origin_order_changes_the_numbers():
    a, b, c, reference = gemm_operands("half", 16, True, seed=9)
    harness.build(gemm_16("half", True, "col_row")).run([a, b, c], (1, 1, 1))
    check(c, reference, **GEMM_TOL)
    swapped = np.full_like(c, np.nan)
    harness.build(gemm_16("half", True, "row_col")).run([a, b, swapped], (1, 1, 1))
    assert np.abs(swapped - reference).max() > 1.0, "swapping ulong2(col, row) went unnoticed"


@needs_cxx
def test_missing_barrier_reads_poisoned_threadgroup_memory():
    """Lanes run in order, so simdgroup 0 loads rows other simdgroups have not written yet: the
    0xFF fill of threadgroup memory turns them into NaN."""
    a, b, c, _ = gemm_operands("half", 32, True, seed=10)
    harness.build(gemm_tiled("half", 32, 32, True, first_barrier=False)).run([a, b, c], (1, 1, 1))
    assert np.isnan(c).any()


@needs_cxx
def test_missing_barrier_is_a_data_race_under_thread_sanitizer():
    a, b, c, reference = gemm_operands("half", 32, True, seed=10)
    sanitized(gemm_tiled("half", 32, 32, True), "thread").run([a, b, c], (1, 1, 1))
    check(c, reference, **GEMM_TOL)   # with the barrier: no report, right numbers
    broken = sanitized(gemm_tiled("half", 32, 32, True, first_barrier=False), "thread")
    with pytest.raises(HarnessError, match="(?s)ThreadSanitizer: data race.*gemm32_half_b32_nt_nobarrier"):
        broken.run([a, b, np.full_like(c, np.nan)], (1, 1, 1))


@needs_cxx
def test_out_of_bounds_write_under_address_sanitizer():
    m, n = 20, 20                            # 2 x 2 tiles of 16 cover 32 x 32 elements
    rng = np.random.default_rng(11)
    x = rng.standard_normal((m, n)).astype(np.float16)
    y = rng.standard_normal((m, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    sanitized(elementwise(), "address").run([x, y, out, 2.0, m, n], (2, 2, 1))
    e = np.exp(x.astype(np.float64))
    check(out, e * 2.0 + y, rtol=0, atol=e * 2.0 * 2.0**-11 + 1e-6)
    unguarded = sanitized(elementwise(store_check=False), "address")
    with pytest.raises(HarnessError, match=r"AddressSanitizer: heap-buffer-overflow.*\nWRITE of size 4"):
        unguarded.run([x, y, np.full_like(out, np.nan), 2.0, m, n], (2, 2, 1))


# body (its first line is line 10 of full_source()) -> the diagnostic it must produce
DIVERGENT = {
    "half_a_simdgroup": ("""
  float v = x[thread_index_in_threadgroup];
  if (thread_index_in_simdgroup < 16u) v = simd_sum(v);
  x[thread_index_in_threadgroup] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
""", r"simdgroup 0: a simdgroup operation not reached by all of its lanes \(divergent control flow\): "
     r"lanes 0-15 wait at simd_sum \(line 11\); lanes 16-31 wait at threadgroup_barrier \(line 13\)"
     r"\n  divergent_half_a_simdgroup\.metal:11: if \(thread_index_in_simdgroup < 16u\)"),
    "two_different_ops": ("""
  float v = x[thread_index_in_threadgroup];
  if (thread_index_in_simdgroup < 16u) v = simd_sum(v);
  else v = simd_max(v);
  x[thread_index_in_threadgroup] = v;
""", r"simdgroup 0: divergent simdgroup operations: lanes 0-15 wait at simd_sum \(line 11\); "
     r"lanes 16-31 wait at simd_max \(line 12\)"),
    "lanes_return_first": ("""
  if (thread_index_in_threadgroup >= 40u) return;
  x[thread_index_in_threadgroup] = simd_max(x[thread_index_in_threadgroup]);
""", r"simdgroup 1: a simdgroup operation not reached by all of its lanes \(divergent control flow\): "
     r"lanes 32-39 wait at simd_max \(line 11\); lanes 40-63 returned"),
    "barrier_in_branches": ("""
  if (thread_index_in_threadgroup < 48u) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
""", r"threadgroup barrier not reached by all live lanes \(divergent control flow\): lanes 0-47 wait at "
     r"threadgroup_barrier \(line 11\); lanes 48-63 wait at threadgroup_barrier \(line 13\)"),
    "non_uniform_load": ("""
  simdgroup_float8x8 m;
  simdgroup_load(m, x + thread_index_in_simdgroup % 2u, 8);
  simdgroup_store(m, x + 64, 8);
""", r"simdgroup 0: simdgroup_load at line 11 gets different arguments in lanes 0 and 1"),
}


@needs_cxx
@pytest.mark.parametrize("sanitizer", [None, "address"])
@pytest.mark.parametrize("case", sorted(DIVERGENT))
def test_divergence_is_a_harness_error(case, sanitizer):
    body, message = DIVERGENT[case]
    if sanitizer:   # lanes are OS threads: whichever simdgroup gets there first reports
        message = re.sub(r"\d+", r"\\d+", message)
    kernel = MslKernel(f"divergent_{case}", "", body, (MslParam("x", "float", True),), (TID, LANE), 64)
    x = np.zeros(128, np.float32)
    with pytest.raises(HarnessError, match=message):
        sanitized(kernel, sanitizer).run([x], (1, 1, 1))


@needs_cxx
def test_more_than_32kb_of_threadgroup_memory():
    kernel = MslKernel("too_much_threadgroup_memory", "", """
  threadgroup float big[64 * 128];
  threadgroup half small[64];  // 32768 + 128 bytes
  big[thread_index_in_threadgroup] = 0.0f;
  small[thread_index_in_threadgroup] = half(0.0f);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  x[thread_index_in_threadgroup] = big[0] + float(small[1]);
""", (MslParam("x", "float", True),), (TID,), 64)
    with pytest.raises(HarnessError, match=r"32896 bytes of threadgroup memory, more than Metal's 32768 "
                                           r"\(32 KB\); largest: float big\[64 \* 128\] \(32768 bytes\)"):
        harness.build(kernel)


@needs_cxx
def test_more_than_1024_threads():
    kernel = MslKernel("too_many_threads", "", "  x[0] = 1.0f;\n", (MslParam("x", "float", True),), (), 2048)
    with pytest.raises(HarnessError, match="2048 threads per threadgroup; Metal allows 1 to 1024"):
        harness.build(kernel)


@needs_cxx
def test_an_unwritten_output_is_caught():
    x = np.random.default_rng(12).standard_normal((3, 300)).astype(np.float32)
    sums, maxes = np.full(3, np.nan, np.float32), np.full(3, np.nan, np.float32)
    harness.build(row_reduce(write_max=False)).run([x, sums, maxes, 300], (3, 1, 1))
    check(sums, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    with pytest.raises(AssertionError, match="3 elements never written"):
        check(maxes, x.max(axis=1), rtol=0, atol=0)


# ---- the harness itself ---------------------------------------------------------------------------

@needs_cxx
def test_compile_errors_point_at_the_kernel_line():
    kernel = MslKernel("typo", "", "  x[0] = undefined_name;\n", (MslParam("x", "float", True),), (), 32)
    with pytest.raises(HarnessError, match=r"could not compile kernel typo(?s:.*)typo\.metal:7:\d+: error: "
                                           r"'undefined_name' was not declared"):
        harness.build(kernel)


@needs_cxx
def test_builds_are_cached_by_content(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path / "cache"))
    first = harness.build(SIMD_OPS)
    second = harness.build(SIMD_OPS)
    assert first.path == second.path and first.path.parent == default_cache_dir() / "metal-harness"
    assert first.compile_seconds > 0 and second.compile_seconds == 0
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1")
    private = harness.build(SIMD_OPS)
    assert private.compile_seconds > 0 and not private.path.is_relative_to(tmp_path)


@needs_cxx
@pytest.mark.parametrize("damage", ["emptied", "corrupted"])
def test_a_damaged_cached_library_is_rebuilt_and_stale_temporary_files_removed(damage, monkeypatch,
                                                                                tmp_path):
    """A cached library that no longer matches its recorded size and digest is compiled again (it
    used to fail every later call with OSError: file too short); a compile removes the temporary
    files that killed compiles left behind, and keeps a recent one (a compile in progress)."""
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    path = harness.build(elementwise()).path          # compiled, never loaded by this process
    data = path.read_bytes()
    middle = len(data) // 2
    path.write_bytes(b"" if damage == "emptied" else
                     data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 4096]) + data[middle + 4096:])
    stale, fresh = path.with_name(f"{'0' * 64}.so.4242.1.tmp"), path.with_name(f"{'1' * 64}.so.4243.1.tmp")
    for tmp in (stale, fresh):
        tmp.write_bytes(data[:100])
    long_ago = time.time() - harness.STALE_TMP_S - 60
    os.utime(stale, (long_ago, long_ago))
    rebuilt = harness.build(elementwise())
    assert rebuilt.path == path and rebuilt.compile_seconds > 0
    assert not stale.exists() and fresh.exists()
    m, n = 19, 21
    x, y = torch.randn(m, n).half(), torch.randn(m, n)
    out = torch.full((m, n), float("nan"))
    rebuilt.run([x, y, out, 0.75, m, n], (2, 2, 1))
    e = np.exp(x.double().numpy())           # exp of a half is a half in MSL: one rounding, 2^-11
    check(out.numpy(), e * 0.75 + y.double().numpy(), rtol=0, atol=e * 0.75 * 2.0**-11 + 1e-6)
    assert harness.build(elementwise()).compile_seconds == 0       # intact again: from the cache


SPIN_CHILD = """
import torch
import tilews
import tilews.language as T


def spin_program():
    @T.prim_func
    def main(X: T.Tensor((128,), T.float32), Y: T.Tensor((128,), T.float32), steps: T.int32):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_fragment((128,), T.float32)
            T.fill(acc, 0)
            for k in T.serial(steps):
                for i in T.Parallel(128):
                    acc[i] = acc[i] * 0.5 + X[i]
            T.copy(acc, Y[0])
    return main


kernel = tilews.jit(target="metal")(spin_program)()
x, y = torch.randn(128), torch.full((128,), float("nan"))
kernel(x, y, 4)
print("running", flush=True)
try:
    kernel(x, y, 2**31 - 1)          # one threadgroup, minutes of work
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
kernel(x, y, 4)                      # the harness still works
print("again", torch.allclose(y, x * 1.875), flush=True)
"""


@needs_cxx
def test_ctrl_c_stops_a_long_metal_kernel(tmp_path):
    """SIGINT during a launch that would run for minutes (one threadgroup, one long loop per lane)
    is a KeyboardInterrupt within seconds, and the kernel runs again afterwards."""
    script = tmp_path / "spin.py"
    script.write_text(SPIN_CHILD)
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "TILEWS_CACHE_DIR": str(tmp_path / "cache")})
    try:
        assert child.stdout.readline() == "running\n", child.stderr.read()
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        start = time.perf_counter()
        out, err = child.communicate(timeout=10)
        assert time.perf_counter() - start < 3
    finally:
        child.kill()
    assert out.splitlines() == ["KeyboardInterrupt", "again True"], err


def test_no_compiler_is_harness_unavailable(monkeypatch):
    monkeypatch.delenv("TILEWS_CXX", raising=False)
    monkeypatch.setenv("PATH", "")
    assert harness.compiler() is None
    with pytest.raises(HarnessUnavailable, match=r"needs a C\+\+17 compiler \(g\+\+ or clang\+\+\); none "
                                                 r"found on PATH; set TILEWS_CXX"):
        harness.build(SIMD_OPS)
    monkeypatch.setenv("TILEWS_CXX", "no-such-c++-compiler")
    assert harness.compiler() is None
    with pytest.raises(HarnessUnavailable, match="TILEWS_CXX='no-such-c\\+\\+-compiler' is not an executable"):
        harness.build(SIMD_OPS)


@needs_cxx
def test_arguments_are_checked():
    kernel = harness.build(gemm_16("half", False))
    a = np.zeros((16, 16), np.float16)
    c = np.zeros((16, 16), np.float32)
    with pytest.raises(TypeError, match=r"parameter B \(half\*\): got elements of type float32, "
                                        r"expected float16"):
        kernel.run([a, np.zeros((16, 16), np.float32), c], (1, 1, 1))
    with pytest.raises(TypeError, match="parameter C \\(float\\*\\): the array must be C-contiguous"):
        kernel.run([a, a, np.zeros((16, 32), np.float32)[:, ::2]], (1, 1, 1))
    with pytest.raises(TypeError, match="takes 3 arguments \\(A, B, C\\), got 2"):
        kernel.run([a, a], (1, 1, 1))
    with pytest.raises(TypeError, match="parameter M \\(uint\\): expected an integer, got 1.5"):
        harness.build(elementwise()).run([a, c, c, 1.0, 1.5, 16], (1, 1, 1))


@needs_cxx
def test_fp8_tensors_pass_as_uchar_bytes():
    body = "  out[thread_index_in_threadgroup] = uint(q[thread_index_in_threadgroup]);\n"
    kernel = MslKernel("fp8_bytes", "", body,
                       (MslParam("q", "uchar", False), MslParam("out", "uint", True)), (TID,), 64)
    q = torch.randn(64).to(torch.float8_e4m3fn)
    out = torch.zeros(64, dtype=torch.int32)       # int32 storage for a uint param
    harness.build(kernel).run([q, out], (1, 1, 1))
    assert torch.equal(out, q.view(torch.uint8).to(torch.int32))
