"""The GEMM programs of ``tilews.ops.gemm_programs`` (``tiled``, ``persistent``, ``split_k`` +
``split_k_reduce``, ``swap_ab``): numerics on the CPU targets, the interpreter oracle of their
Hopper lowering, and compile-only sm_90a builds.

1. Numerics: every program on ``"interpret"`` and ``"triton"`` (Triton's CPU interpreter, chosen
   by ``tests/conftest.py``), fp16 and bf16, random inputs, float64 references, tolerances in
   ``TOL``. Shapes are ragged in M, N and K. A static M writes into views of larger NaN-filled
   buffers (a store outside the view is caught); a runtime M (``T.dynamic("M")``) is one kernel
   called at several M values, its outputs allocated by tilews (poisoned: ``TILEWS_POISON_OUTPUTS``).
   split_k's float32 workspace [M, splits * Np] is checked slice by slice (Np = N in whole tiles,
   the columns past N zero) before the reduction.
2. The oracle: each program before the passes equals it after ``lower(..., HOPPER)`` under 20
   random schedules (``tests.test_ws_oracle.assert_same_under_schedules``), with TMA (AsyncPlan)
   in the lowered form, and the lowered result equals the reference.
3. Compile-only: each program at an LLM shape with a runtime M reaches the Gluon backend; its
   TTGIR / PTX hold the warp-specialized partitions, wgmma and TMA. swap_ab's wgmma reads both
   operands from shared memory through transposed views; split_k's grid has three dims.
4. Refusal: a runtime K (a runtime dim after A's first) sends Hopper to ``tl`` with the reason in
   the report, and the program still computes correctly on the CPU targets.
5. float32 (compile-only, the generated source): ``tiled`` at ``precision="ieee"`` is refused
   by Gluon (wgmma's float32 form is tf32) and spelled ``tl.dot(..., input_precision="ieee")``;
   at ``"tf32"`` its N-major B tile keeps it off wgmma too (``input_precision="tf32"``); a
   K-major float32 gemm at ``"tf32"`` is a tf32 wgmma in the PTX.
"""
from __future__ import annotations

import functools
import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.traverse import walk
from tilews.lowering.frontend import build_kernel
from tilews.lowering.plans import AsyncPlan
from tilews.ops import gemm_programs as G
from tilews.ops.matmul import _program
from tilews.ops.schedule import REGISTER_STAGED
from tilews.triton_ext.toolchain import ptxas_report

from .helpers import poisoned, randn
from .test_ws_oracle import assert_same_under_schedules, run_interp

CPU_TARGETS = ("interpret", "triton")
DTYPES = {"fp16": (T.float16, torch.float16), "bf16": (T.bfloat16, torch.bfloat16)}

# (atol, rtol) of the cast output against the float64 reference. Triton's interpreter converts
# float32 to bfloat16 by truncation (a whole ulp, 2^-7 relative); fp16 rounds (2^-11).
TOL = {"fp16": (1e-2, 2e-3), "bf16": (5e-2, 1e-2)}
# split_k's float32 workspace: exact products, float32 sums over at most K terms
TOL_WORKSPACE = (1e-3, 1e-5)

# CPU-sized knobs of each program (blocks smaller than the shapes' M, N and K, so every edge is
# ragged); split_k_reduce takes SPLIT_K_REDUCE
KNOBS = {
    "tiled": dict(block_M=64, block_N=64, block_K=32, num_stages=2),
    "tiled_swizzled": dict(block_M=32, block_N=32, block_K=32, num_stages=3, swizzle=2),
    "persistent": dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128, num_sms=3,
                       group_size=2),
    "split_k": dict(splits=3, block_M=64, block_N=64, block_K=32, num_stages=2),
    "swap_ab": dict(block_N=64, block_M=32, block_K=32, num_stages=2),
}
SPLIT_K_REDUCE = dict(block_M=32, block_N=64)
PROGRAMS = {"tiled": G.tiled, "tiled_swizzled": G.tiled, "persistent": G.persistent,
            "swap_ab": G.swap_ab}

STATIC = (70, 136, 100)          # M, N, K: none a multiple of its block; K rows not 16-byte aligned
DYNAMIC_N, DYNAMIC_K = 80, 96
DYNAMIC_MS = (1, 5, 70)          # one kernel for all three


def close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    """Every element within ``atol + rtol * |ref|`` (a NaN, i.e. an unwritten element, is not)."""
    err = (out.double() - ref).abs()
    bad = ~(err <= atol + rtol * ref.abs())
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} elements off (first at "
                           f"{bad.nonzero()[0].tolist()}); max |err| {err.max():.3g}")


def inputs(M, N, K, dtype, seed):
    return randn(M, K, dtype=dtype, seed=seed), randn(K, N, dtype=dtype, seed=seed + 1)


def workspace_ref(a, b, splits, block_K, block_N):
    """split_k's workspace in float64: [M, splits * Np], slice s (columns s * Np ...) holding
    ``A[:, Ks] @ B[Ks, :]`` for the s-th K slice Ks, then zeros up to Np."""
    (M, K), N = a.shape, b.shape[1]
    width, Np = G.k_tiles_per_split(K, block_K, splits) * block_K, G.split_width(N, block_N)
    w = torch.zeros(M, splits, Np, dtype=torch.float64)
    for s in range(splits):
        w[:, s, :N] = a.double()[:, s * width:(s + 1) * width] @ b.double()[s * width:(s + 1) * width]
    return w.reshape(M, splits * Np)


def view_of_poisoned(rows, cols, dtype):
    """A [rows, cols] view into a NaN buffer 8 larger in both dims, and the buffer."""
    big = poisoned(rows + 8, cols + 8, dtype=dtype)
    return big[:rows, :cols], big


def assert_only_view_written(big, view):
    rows, cols = view.shape
    assert big[rows:].isnan().all() and big[:, cols:].isnan().all(), "stored outside the output view"


def compiled(target, factory, *args, out=False, **kw):
    return tilews.jit(target=target, out_idx=[-1] if out else None)(factory.fn)(*args, **kw)


# ----------------------------------------------------------------------------------------------
# 1. numerics on the CPU targets


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_static_m(name, target, dt):
    (tdt, torch_dt), (M, N, K) = DTYPES[dt], STATIC
    k = compiled(target, PROGRAMS[name], M, N, K, dtype=tdt, out_dtype=tdt, **KNOBS[name])
    a, b = inputs(M, N, K, torch_dt, seed=1)
    c, big = view_of_poisoned(M, N, dtype=torch_dt)
    k(a, b, c)
    close(c, a.double() @ b.double(), *TOL[dt])
    assert_only_view_written(big, c)


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_runtime_m(name, target, dt):
    tdt, torch_dt = DTYPES[dt]
    k = compiled(target, PROGRAMS[name], T.dynamic("M"), DYNAMIC_N, DYNAMIC_K, out=True,
                 dtype=tdt, out_dtype=tdt, **KNOBS[name])
    for M in DYNAMIC_MS:
        a, b = inputs(M, DYNAMIC_N, DYNAMIC_K, torch_dt, seed=M)
        c = k(a, b)
        assert c.shape == (M, DYNAMIC_N) and c.dtype == torch_dt
        close(c, a.double() @ b.double(), *TOL[dt])


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("target", CPU_TARGETS)
def test_split_k_static_m(target, dt):
    # K = 100: 4 k tiles, 2 per slice, so the third slice lies wholly past K (reads zeros)
    (tdt, torch_dt), (M, N, K) = DTYPES[dt], STATIC
    knobs = KNOBS["split_k"]
    splits, Np = knobs["splits"], G.split_width(N, knobs["block_N"])
    partial = compiled(target, G.split_k, M, N, K, dtype=tdt, **knobs)
    reduce = compiled(target, G.split_k_reduce, M, N, splits, Np, out_dtype=tdt, **SPLIT_K_REDUCE)
    a, b = inputs(M, N, K, torch_dt, seed=2)
    w, w_big = view_of_poisoned(M, splits * Np, dtype=torch.float32)
    partial(a, b, w)
    close(w, workspace_ref(a, b, splits, knobs["block_K"], knobs["block_N"]), *TOL_WORKSPACE)
    assert_only_view_written(w_big, w)
    c, big = view_of_poisoned(M, N, dtype=torch_dt)
    reduce(w, c)
    close(c, a.double() @ b.double(), *TOL[dt])
    assert_only_view_written(big, c)


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("target", CPU_TARGETS)
def test_split_k_runtime_m(target, dt):
    # K = 96: 3 k tiles, one per slice
    tdt, torch_dt = DTYPES[dt]
    knobs = KNOBS["split_k"]
    M, splits, Np = T.dynamic("M"), knobs["splits"], G.split_width(DYNAMIC_N, knobs["block_N"])
    partial = compiled(target, G.split_k, M, DYNAMIC_N, DYNAMIC_K, out=True, dtype=tdt, **knobs)
    reduce = compiled(target, G.split_k_reduce, M, DYNAMIC_N, splits, Np, out=True,
                      out_dtype=tdt, **SPLIT_K_REDUCE)
    for m in DYNAMIC_MS:
        a, b = inputs(m, DYNAMIC_N, DYNAMIC_K, torch_dt, seed=10 + m)
        w = partial(a, b)
        assert w.shape == (m, splits * Np) and w.dtype == torch.float32
        close(w, workspace_ref(a, b, splits, knobs["block_K"], knobs["block_N"]), *TOL_WORKSPACE)
        c = reduce(w)
        assert c.shape == (m, DYNAMIC_N) and c.dtype == torch_dt
        close(c, a.double() @ b.double(), *TOL[dt])


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("target", CPU_TARGETS)
def test_split_k_fused(target, dt):
    # the workspace as split_k's, C summed by the last block of each tile, the counts back at 0;
    # one kernel for every M (K = 100: the third slice lies wholly past K)
    tdt, torch_dt = DTYPES[dt]
    (_, N, K), knobs = STATIC, dict(KNOBS["split_k"], block_M=16)
    splits, Np = knobs["splits"], G.split_width(N, knobs["block_N"])
    k = tilews.jit(target=target, out_idx=[-2, -1])(G.split_k_fused.fn)(
        T.dynamic("M"), N, K, dtype=tdt, out_dtype=tdt, **knobs)
    arrivals = torch.zeros(64, dtype=torch.int32)
    for m in (1, 5, 70):
        a, b = inputs(m, N, K, torch_dt, seed=20 + m)
        for _ in range(2):
            w, c = k(a, b, arrivals)
            close(w, workspace_ref(a, b, splits, knobs["block_K"], knobs["block_N"]), *TOL_WORKSPACE)
            close(c, a.double() @ b.double(), *TOL[dt])
            assert int(arrivals.abs().sum()) == 0
    if target == "interpret":       # blocks finishing in any order: the same bits
        a, b = inputs(70, N, K, torch_dt, seed=30)
        want = None
        for order in range(4):
            c = poisoned(70, N, dtype=torch_dt)
            w = poisoned(70, splits * Np, dtype=torch.float32)
            named = dict(A=a, B=b, Arrivals=arrivals, W=w, C=c, M=70, arrival_slots=64)
            interpreter.run(k.ir_before, [named[p.name] for p in k.ir_before.params], block_order=order)
            want = c if want is None else want
            assert torch.equal(c, want) and int(arrivals.abs().sum()) == 0
        close(want, a.double() @ b.double(), *TOL[dt])


# 4 x 3 tiles of 7 k tiles (K = 208: the last half past K) over 5 blocks: 2 tiles shared out
# (14 iterations as 2 + 3 + 3 + 3 + 3: a tile spans 3 blocks), 10 whole ones in turn
STREAM_K = dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128, num_sms=5,
                group_size=2)


@pytest.mark.parametrize("shared_first", [True, False], ids=["shared_first", "whole_first"])
@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("target", CPU_TARGETS)
def test_stream_k(target, dt, shared_first):
    # C against float64, the counts back at 0 after each launch; on the interpreter, the same
    # bits whichever block arrives last (blocks run in shuffled orders)
    tdt, torch_dt = DTYPES[dt]
    M, N, K = 200, 136, 208
    assert G.StreamK.plan(4 * 3, 7, 5).sk_tiles == 2
    k = tilews.jit(target=target, out_idx=[-2, -1])(G.stream_k.fn)(
        M, N, K, dtype=tdt, out_dtype=tdt, shared_first=shared_first, **STREAM_K)
    arrivals = torch.zeros(16, dtype=torch.int32)
    a, b = inputs(M, N, K, torch_dt, seed=40)
    for _ in range(2):
        _, c = k(a, b, arrivals)
        close(c, a.double() @ b.double(), *TOL[dt])
        assert int(arrivals.abs().sum()) == 0
    if target == "interpret":
        # slot 0 of a tile arriving last keeps its partial in registers (W's slot 0 stays
        # poisoned), else it stores it: both happen over these orders, with the same bits
        want, slot0_kept = None, set()
        slots = G.StreamK.plan(4 * 3, 7, 5).slots
        for order in [None, *range(8)]:
            c = poisoned(M, N, dtype=torch_dt)
            w = poisoned(*next(p for p in k.ir_before.params if p.name == "W").static_shape,
                         dtype=torch.float32)
            named = dict(A=a, B=b, Arrivals=arrivals, W=w, C=c, arrival_slots=16)
            interpreter.run(k.ir_before, [named[p.name] for p in k.ir_before.params], block_order=order)
            want = c if want is None else want
            assert torch.equal(c, want) and int(arrivals.abs().sum()) == 0
            slot0_kept |= {bool(w[t * slots * 64:(t * slots + 1) * 64].isnan().all()) for t in range(2)}
        assert slot0_kept == {True, False}
        close(want, a.double() @ b.double(), *TOL[dt])


def test_stream_k_needs_m_at_build_time():
    with pytest.raises(TypeError, match="M, N and K must be ints known at build time"):
        G.stream_k.fn(T.dynamic("M"), 64, 64)


@pytest.mark.parametrize("tiles, k_tiles, blocks, waves", [
    (2048, 64, 132, 0), (2048, 64, 132, 1), (512, 64, 132, 0), (128, 64, 132, 0), (16, 64, 132, 0),
    (12, 7, 5, 0), (9, 7, 4, 1), (133, 1, 132, 0), (264, 64, 132, 0), (131, 3, 132, 0)])
def test_stream_k_plan_covers_every_iteration_once(tiles, k_tiles, blocks, waves):
    """Walk the plan as the program does: every k iteration of every tile is run by exactly one
    (block, segment); the segments a tile is cut into are its blocks' ranks 0..parts-1; no block
    has more segments than ``segments`` nor a tile more blocks than ``slots``."""
    sk = G.StreamK.plan(tiles, k_tiles, blocks, waves)
    assert 0 <= sk.sk_tiles <= tiles
    assert sk.sk_tiles == 0 or (tiles - sk.sk_tiles) % blocks == 0 or tiles < blocks
    ran = {}
    for b in range(blocks):
        lo, hi = sk.first_iter(b), sk.first_iter(b + 1)
        assert sk.sk_tiles == 0 or hi > lo                 # every block gets an iteration
        for r in range(sk.segments):
            t = lo // k_tiles + r
            k_lo, k_hi = max(lo - t * k_tiles, 0), min(hi - t * k_tiles, k_tiles)
            if k_lo >= k_hi:
                continue
            first, last = sk.owner(t * k_tiles), sk.owner((t + 1) * k_tiles - 1)
            assert first <= b <= last and last - first + 1 <= sk.slots
            for k in range(k_lo, k_hi):
                assert (t, k) not in ran
                ran[t, k] = b
        assert hi <= lo or (hi - 1) // k_tiles - lo // k_tiles + 1 <= sk.segments
    assert set(ran) == {(t, k) for t in range(sk.sk_tiles) for k in range(k_tiles)}
    for t in range(sk.sk_tiles):                           # a tile's blocks are consecutive
        owners = sorted({ran[t, k] for k in range(k_tiles)})
        assert owners == list(range(owners[0], owners[-1] + 1))


def test_split_sizes():
    assert [G.k_tiles_per_split(K, 32, 3) for K in (1, 32, 96, 97, 100, 192, 193)] == \
        [1, 1, 1, 2, 2, 2, 3]
    assert G.k_tiles_per_split(168, 32, 4) == 2       # 6 tiles: the last slice covers none
    assert [G.split_width(N, 64) for N in (1, 64, 80, 136)] == [64, 64, 128, 192]


# ----------------------------------------------------------------------------------------------
# 2. the interpreter oracle of the Hopper lowering


# name -> (M, N, K, program, knobs), fp16
ORACLE = {
    # K = 168: 6 k tiles (the last half past K), 2 per slice: the fourth slice reads only past K;
    # rows of 336 bytes keep the loads TMA; N = 80: each slice's second tile is ragged
    "split_k": (70, 80, 168, G.split_k, dict(splits=4, block_M=64, block_N=64, block_K=32,
                                             num_stages=2)),
    # M below block_M; N ragged against block_N
    "swap_ab": (5, 136, 96, G.swap_ab, dict(block_N=64, block_M=32, block_K=32, num_stages=3,
                                            out_dtype=T.float16)),
    # 64-row tiles, ragged M and N
    "tiled": (136, 80, 96, G.tiled, dict(block_M=64, block_N=64, block_K=32, num_stages=2,
                                         out_dtype=T.float16)),
    # split_k's shape, summed in the kernel by the last block of each tile
    "split_k_fused": (70, 80, 168, G.split_k_fused, dict(splits=4, block_M=64, block_N=64, block_K=32,
                                                         num_stages=2, out_dtype=T.float16)),
    # 4 x 2 tiles over 3 blocks: uneven
    "persistent": (200, 80, 96, G.persistent, dict(block_M=64, block_N=64, block_K=32, num_stages=2,
                                                   threads=128, num_sms=3, group_size=2,
                                                   out_dtype=T.float16)),
    # 4 x 2 tiles of 7 k tiles (the last half past K) over 5 blocks: 3 tiles shared out, 21
    # iterations as 4 + 4 + 4 + 4 + 5, so one tile spans 3 blocks; ragged M and N
    "stream_k": (200, 80, 208, G.stream_k, dict(block_M=64, block_N=64, block_K=32, num_stages=2,
                                                threads=128, num_sms=5, group_size=2,
                                                out_dtype=T.float16)),
    # the same, whole tiles first
    "stream_k_whole_first": (200, 80, 208, G.stream_k, dict(
        block_M=64, block_N=64, block_K=32, num_stages=2, threads=128, num_sms=5, group_size=2,
        shared_first=False, out_dtype=T.float16)),
}


def oracle_case(name, runtime_m):
    """(frontend IR, interpreter arguments, index of the output, float64 reference of it)."""
    M, N, K, program, knobs = ORACLE[name]
    prim = program.fn(T.dynamic("M") if runtime_m else M, N, K, dtype=T.float16, **knobs)
    a, b = inputs(M, N, K, torch.float16, seed=30)
    kernel = build_kernel(prim)
    if name == "split_k":
        ref = workspace_ref(a, b, knobs["splits"], knobs["block_K"], knobs["block_N"])
        out = torch.empty(*ref.shape)
    else:
        out, ref = torch.empty(M, N, dtype=torch.float16), a.double() @ b.double()
    named = dict(M=M, A=a, B=b, C=out, arrival_slots=8, Arrivals=torch.zeros(8, dtype=torch.int32))
    if name == "split_k_fused":
        named["W"] = torch.empty(M, knobs["splits"] * G.split_width(N, knobs["block_N"]))
    elif name.startswith("stream_k"):
        named["W"] = torch.empty(*next(p for p in kernel.params if p.name == "W").static_shape)
    else:
        named["W" if name == "split_k" else "C"] = out
    args = [named[p.name] for p in kernel.params]
    return kernel, args, len(args) - 1, ref


# stream_k plans a fixed number of tiles: its M is known at build time
@pytest.mark.parametrize("name,runtime_m", [
    (name, runtime_m) for name in ORACLE for runtime_m in (False, True)
    if not (runtime_m and name.startswith("stream_k"))])
def test_oracle_before_equals_after_hopper_passes(name, runtime_m):
    before, args, out_index, ref = oracle_case(name, runtime_m)
    assert [p.name for p in before.params][:1] == (["M"] if runtime_m else ["A"])
    after = assert_same_under_schedules(before, args, out_index)
    plan = after.find_plan(AsyncPlan)
    assert plan is not None, after.notes          # the TMA form, not the synchronous fallback
    if name == "split_k":                         # the partial tile leaves by a TMA store
        assert ("W", (64, 64)) in plan.tma_descriptors
    if name.startswith(("split_k_fused", "stream_k")):   # ... but a partial the kernel reads leaves
        # from registers (a bulk store's wait covers its reads only); C, never read, by TMA
        assert plan.tma_buffers == {"A", "B", "C"}
        assert {b for b, _ in plan.pointer_params} == {"Arrivals", "W"}
        assert int(args[[p.name for p in before.params].index("Arrivals")].abs().sum()) == 0
    got = run_interp(after, args, out_index, seed=99)
    close(got, ref, *(TOL_WORKSPACE if name == "split_k" else TOL["fp16"]))


# ----------------------------------------------------------------------------------------------
# 3. compile-only for sm_90a (no GPU needed)


LLM_N, LLM_K = 4096, 4096


@functools.lru_cache(maxsize=None)
def hopper_kernel(name):
    """Each program at its default (GPU) knobs, bf16, with a runtime M."""
    f = {"tiled": G.tiled, "persistent": G.persistent, "split_k": G.split_k, "swap_ab": G.swap_ab,
         "split_k_fused": G.split_k_fused}[name]
    knobs = {"tiled": dict(block_M=64),                          # the small-M tile
             "split_k_fused": dict(block_M=64, block_N=128, block_K=64, splits=4)}.get(name, {})
    return compiled("hopper", f, T.dynamic("M"), LLM_N, LLM_K, out=True, **knobs)


def wgmma_instructions(ptx):
    """(shape, imm-trans-a, imm-trans-b) of each wgmma whose A and B are shared-memory descriptors
    (64-bit registers; an A in registers would be a braced register list)."""
    return re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k16)\.f32\.bf16\.bf16 \{[^}]*\}, "
                      r"%rd\d+, %rd\d+, %p\d+, 1, 1, (\d), (\d);", ptx)


@pytest.mark.parametrize("name", ["tiled", "persistent", "split_k", "swap_ab"])
def test_compiles_on_gluon_with_runtime_m(name):
    k = hopper_kernel(name)
    assert k.report.target == "hopper", k.report.notes
    assert not any("using tl" in n for n in k.report.notes), k.report.notes
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    assert re.search(r"@main\(%M: i32", ttgir)                     # M is a kernel argument
    assert ttgir.count("ttg.warp_specialize(") == 1
    assert re.search(r"ttng\.warp_group_dot .*isAsync = true", ttgir)
    assert ttgir.count("ttng.async_tma_copy_global_to_local") == 2
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier", ptx)) >= 2
    assert wgmma_instructions(ptx) and len(wgmma_instructions(ptx)) == ptx.count("wgmma.mma_async")
    # every program but swap_ab (a transposing element-wise store) stores its tile by TMA
    stores = 0 if name == "swap_ab" else 1
    assert ttgir.count("ttng.async_tma_copy_local_to_global") == stores


def test_tiled_reads_a_k_major_and_b_mn_major():
    # the baseline for swap_ab: A [M, K] row-major is K-major, B [K, N] row-major is MN-major
    assert set(wgmma_instructions(hopper_kernel("tiled").asm["ptx"])) == {("m64n128k16", "0", "1")}


def test_swap_ab_wgmma_reads_transposed_shared_views():
    k = hopper_kernel("swap_ab")
    ttgir = k.asm["ttgir"]
    dot = re.search(r"ttng\.warp_group_dot (%\w+), (%\w+), .* : (!ttg\.memdesc<[^>]*>) \* "
                    r"(!ttg\.memdesc<[^>]*>) -> tensor<(\d+)x(\d+)xf32", ttgir)
    assert dot, "the wgmma does not take both operands from shared memory"
    # C^T tile [block_N, block_M] = (B_s: [K, block_N])^T @ (A_s: [block_M, K])^T
    assert dot.group(3).startswith("!ttg.memdesc<128x64xbf16")
    assert dot.group(4).startswith("!ttg.memdesc<64x32xbf16")
    assert (dot.group(5), dot.group(6)) == ("128", "32")
    for operand, stored in ((dot.group(1), "64x128"), (dot.group(2), "32x64")):
        assert re.search(rf"{operand} = ttg\.memdesc_trans %\w+ {{order = array<i32: 1, 0>}} : "
                         rf"!ttg\.memdesc<{stored}xbf16", ttgir), operand
    # PTX: the A operand (B_s^T, contiguous along the instruction's M) is read MN-major
    # (imm-trans-a = 1), the B operand (A_s^T, contiguous along K) K-major; N = block_M = 32
    wgmmas = wgmma_instructions(k.asm["ptx"])
    assert set(wgmmas) == {("m64n32k16", "1", "0")}
    assert len(wgmmas) == (128 // 64) * (64 // 16)      # row blocks x k steps per k tile
    src = k.get_kernel_source()
    assert re.search(r"warpgroup_mma\(B_s\.index\([^)]*\)\.permute\(\(1, 0\)\), "
                     r"A_s\.index\([^)]*\)\.permute\(\(1, 0\)\)", src)


def test_split_k_fused_is_warp_specialized_and_releases_after_its_stores():
    """The partial leaves from registers (a bulk store's wait covers only its reads), every
    thread of the consumer has stored before one adds with acq_rel, and all wait for the add
    before reading the other partials; C, which the kernel never reads, leaves by TMA."""
    k = hopper_kernel("split_k_fused")
    assert k.report.target == "hopper", k.report.notes
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    assert ttgir.count("ttg.warp_specialize(") == 1
    assert re.search(r"ttng\.warp_group_dot .*isAsync = true", ttgir)
    assert "tensordesc<tensor<64x128xf32" not in ttgir
    assert re.findall(r"ttng\.async_tma_copy_local_to_global %(\w+)\[", ttgir) == ["C_desc_0"]
    default = ttgir[ttgir.index("default {"):ttgir.index("partition0(")]
    release = re.search(r"gpu\.barrier[^\n]*\n(?:.*\n){0,6}?.*tt\.atomic_rmw add, acq_rel, gpu, .*\n"
                        r"(?:.*\n){0,3}?.*gpu\.barrier", default)
    assert release, "no barrier on each side of the acq_rel add"
    assert default.index("tt.store") < release.start()      # the partial, before the release
    assert re.search(r"tt\.atomic_rmw add, relaxed, gpu", default)   # the reset
    # PTX: the partial in 8-byte vectors, the consumer's named barrier, then one thread's add
    add = ptx.index("atom.global.gpu.acq_rel.add")
    assert "bar.sync \t0, 128;" in ptx[ptx.rindex("st.global.v2.b32", 0, add):add]
    assert len(re.findall(r"st\.global\.v2\.b32", ptx)) == 64 * 128 // 128 // 2


def test_stream_k_keeps_wgmma_in_flight_and_bulk_stores_only_c():
    """At 4096^3 (116 tiles shared out, 396 whole): the segment's k loop, whose trip count varies
    by tile, keeps one wgmma in flight (ring counter, not the tile's iteration number); a
    partial leaves from registers ahead of the acq_rel count, and slot 0's count is read with
    acquire (then a barrier) before it reads the others; C leaves by TMA from one staging
    buffer for all four of its stores (whole tile, slot 0's sum, the last arriver's in either
    branch), each store's wait moved before the buffer's next write."""
    k = tilews.jit(target="hopper", out_idx=[-2, -1])(G.stream_k.fn)(LLM_N, LLM_N, LLM_K)
    assert k.report.target == "hopper", k.report.notes
    ttgir = k.asm["ttgir"]
    assert ttgir.count("ttg.warp_specialize(") == 1
    default = ttgir[ttgir.index("default {"):ttgir.index("partition0(")]
    k_loop = re.search(r"scf\.for %k = .*\n((?:.*\n)*?)\s*scf\.yield", default)
    assert k_loop and "warp_group_dot_wait" in k_loop.group(1)
    assert re.search(r"warp_group_dot_wait %\w+ \{pendings = 1 : i32\}", k_loop.group(1))
    assert "xf32, #shared" not in ttgir and "tensordesc<tensor<128x256xf32" not in ttgir
    stagings = re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<128x256xbf16", ttgir)
    assert len(stagings) == 1
    ops = re.findall(r"(ttng\.async_tma_store_wait|ttg\.local_store [^\n]*C_f_stage|"
                     r"ttng\.async_tma_copy_local_to_global %C_desc_0|tt\.store [^\n]*f32>|"
                     r"tt\.load [^\n]*f32>|gpu\.barrier|tt\.atomic_rmw add, \w+)", default)
    ops = [o if o.startswith("tt.atomic") else o.split(" ")[0] for o in ops]
    store_c = ["ttng.async_tma_store_wait", "ttg.local_store", "ttng.async_tma_copy_local_to_global"]
    arrive = ["tt.store", "gpu.barrier", "tt.atomic_rmw add, acq_rel", "gpu.barrier", "tt.load", "tt.load",
              *store_c, "tt.atomic_rmw add, relaxed"]
    assert ops == ["gpu.barrier", "gpu.barrier",      # the two k loops' ring-slot releases
                   *store_c,                                               # a whole tile
                   "tt.atomic_rmw add, acquire", "gpu.barrier", "tt.load",  # slot 0, every other in
                   *store_c, "tt.atomic_rmw add, relaxed",
                   *arrive, *arrive,                                        # else: the count
                   "ttng.async_tma_store_wait"], ops                        # after the tile loop
    report = ptxas_report(k.asm["ptx"])          # the sums' loads add no spills to the consumer
    if report is not None:
        assert "C7514" not in report and "0 bytes spill stores" in report, report


def test_split_k_grid_has_three_dims():
    k = hopper_kernel("split_k")
    src = k.get_kernel_source()
    grid = re.search(r"def main_grid\(M\):\n    return \((.*)\)\n", src)
    assert grid, src
    dims = [d.strip() for d in re.split(r",(?![^(]*\))", grid.group(1))]
    assert len(dims) == 3 and dims[0] == str(LLM_N // 128) and dims[2] == "4", dims
    assert "// 64" in dims[1]                             # ceildiv(M, block_M): the runtime dim
    assert "gl.program_id(2)" in src
    # the float32 partial tile leaves by a TMA store of [block_M, block_N]
    assert "tensordesc<tensor<64x128xf32" in k.asm["ttgir"]
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", k.asm["ptx"])


# ----------------------------------------------------------------------------------------------
# 4. a runtime dim after the first: no TMA, so Hopper falls back to tl


def runtime_k(target, dtype=T.float16):
    return compiled(target, G.tiled, T.dynamic("M"), DYNAMIC_N, T.dynamic("K"), out=True,
                    dtype=dtype, out_dtype=dtype, block_M=64, block_N=64, block_K=32, num_stages=2)


def test_runtime_k_falls_back_to_tl_on_hopper():
    k = runtime_k("hopper", T.bfloat16)
    assert k.report.target == "hopper -> triton", k.report.notes
    assert any("'A' has a runtime dimension after its first" in n and "using tl" in n
               for n in k.report.notes), k.report.notes


def test_unaligned_rows_load_through_the_producers_registers_with_the_pass_config():
    """K = 4100 bf16: A's rows (8200 bytes) are not TMA's. By default the program falls back to
    tl, the note naming the switch; with tl.enable_lower_ldgstg the producer runs a warp group
    that loads A (2-byte loads: the rows are 8-byte aligned at best) and stores it in 16-byte
    vectors into the ring, fences, synchronizes its warps, arrives expecting B's bytes, then
    issues B's TMA."""
    plain = compiled("hopper", G.tiled, 4096, 4096, 4100, out=True)
    assert plain.report.target == "hopper -> triton"
    assert any("tl.enable_lower_ldgstg" in n for n in plain.report.notes), plain.report.notes
    k = tilews.jit(target="hopper", out_idx=[-1], pass_configs={"tl.enable_lower_ldgstg": True})(
        G.tiled.fn)(4096, 4096, 4100)
    assert k.report.target == "hopper", k.report.notes
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    producer = ttgir[ttgir.index("partition0("):]
    assert re.search(r"partition0\([^\n]*\) num_warps\(4\)", producer)
    assert producer.count("ttng.async_tma_copy_global_to_local") == 1          # B
    assert producer.count("ttg.local_store") == 128 // 32                       # A in 4 chunks
    ops = [o.split(" ")[0] for o in re.findall(
        r"ttng\.async_tma_copy_global_to_local|tt\.load|ttg\.local_store|ttng\.fence_async_shared|"
        r"gpu\.barrier|ttng\.barrier_expect", producer)]
    assert ops == ["tt.load", "ttg.local_store"] * 4 + \
        ["ttng.fence_async_shared", "gpu.barrier", "ttng.barrier_expect",
         "ttng.async_tma_copy_global_to_local"], ops
    assert set(re.findall(r"ld\.global\.[\w.]+", ptx)) == {"ld.global.b16"}
    assert "st.shared.v4.b32" in ptx
    fence = ptx.index("fence.proxy.async")
    assert re.search(r"bar\.sync \t\d+, 128;", ptx[fence:ptx.index("mbarrier.arrive.expect_tx", fence)])
    report = ptxas_report(ptx)
    if report is not None:
        assert "0 bytes spill stores" in report, report


@pytest.mark.parametrize("shape, staged, c_by_tma", [
    ((4095, 4097, 4099), {"A_s", "B_s"}, False), ((4096, 4097, 4096), {"B_s"}, False),
    ((4096, 4096, 4100), {"A_s"}, True)])
def test_register_staged_128x256_gemm_keeps_its_registers(shape, staged, c_by_tma):
    """The large tile (two consumer warp groups) with one or both operands loaded through the
    producer's registers: the producer gets 96 registers (64 spilled with both), the consumers
    the rest, nothing spills; C's tiles leave by TMA only where its rows allow it."""
    k = tilews.jit(target="hopper", out_idx=[-1], pass_configs={"tl.enable_lower_ldgstg": True})(
        G.tiled.fn)(*shape, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256)
    assert k.report.target == "hopper", k.report.notes
    plan = k.ir_after.plan(AsyncPlan)
    assert {name for name, _, _ in plan.register_loads} == staged
    producer = next(r for s in walk(k.ir_after.body) if isinstance(s, ir.WarpSpecialize)
                    for r in s.roles if r.warpgroups == (0,))
    assert (producer.num_warps, producer.num_regs) == (4, 96)
    assert ("ttng.async_tma_copy_local_to_global" in k.asm["ttgir"]) == c_by_tma
    report = ptxas_report(k.asm["ptx"])
    if report is not None:
        assert "0 bytes spill stores" in report, report


@pytest.mark.parametrize("schedule", REGISTER_STAGED, ids=str)
def test_ops_register_staged_schedules_stay_warp_specialized(schedule):
    """tilews.ops's ``Schedule.registers`` compiles its program with tl.enable_lower_ldgstg: at a
    runtime M with rows TMA cannot take (N = 4097, K = 4099) it stays on the Hopper path."""
    k = _program(schedule.program, "hopper", registers=True)(
        T.dynamic("M"), 4097, 4099, block_M=schedule.block_M, block_N=schedule.block_N,
        block_K=schedule.block_K, num_stages=schedule.num_stages, threads=schedule.threads,
        **({"splits": schedule.splits} if schedule.splits > 1 else {}))
    assert k.report.target == "hopper", k.report.notes
    assert k.ir_after.plan(AsyncPlan).register_loads
    assert _program(schedule.program, "hopper") is not _program(schedule.program, "hopper", registers=True)


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_runtime_k_computes_on_cpu(target):
    k = runtime_k(target)
    for M, K in ((5, 100), (70, 64)):
        a, b = inputs(M, DYNAMIC_N, K, torch.float16, seed=40 + K)
        close(k(a, b), a.double() @ b.double(), *TOL["fp16"])


# ----------------------------------------------------------------------------------------------
# 5. float32 precision on Hopper (compile-only)


@pytest.mark.parametrize("precision, refusal", [
    ("ieee", "wgmma's float32 form rounds to tf32, and T.gemm at line"),
    ("tf32", "tf32 wgmma reads K-major operands only, and the B tile"),
])
def test_float32_tiled_goes_to_tl_with_its_precision(precision, refusal):
    k = compiled("hopper", G.tiled, T.dynamic("M"), 256, 256, out=True, block_M=64, block_N=128,
                 block_K=32, num_stages=2, dtype=T.float32, out_dtype=T.float32, precision=precision)
    assert k.report.backend == "tl" and any(refusal in n for n in k.report.notes), k.report.notes
    dots = re.findall(r"tl\.dot\([^\n]*", k.get_kernel_source())
    assert dots and all(f'input_precision="{precision}"' in d for d in dots), dots


@tilews.jit(target="hopper", out_idx=[-1])
def k_major_f32(M, N, K, precision, block_M=64, block_N=128, block_K=32):
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float32), B: T.Tensor((N, K), T.float32),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), T.float32)
            B_s = T.alloc_shared((block_N, block_K), T.float32)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[bx * block_N, k * block_K], B_s)
                T.gemm(A_s, B_s, C_f, transpose_B=True, precision=precision)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def test_float32_k_major_tf32_is_a_tf32_wgmma():
    k = k_major_f32(256, 256, 256, "tf32")
    assert k.report.backend == "gluon", k.report.notes
    assert "warpgroup_mma(" in k.get_kernel_source()
    mmas = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[.\w]+", k.asm["ptx"]))
    assert mmas == {"wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"}
    exact = k_major_f32(256, 256, 256, "ieee")
    assert exact.report.backend == "tl"
    assert 'input_precision="ieee"' in exact.get_kernel_source()


def test_an_unknown_precision_is_an_error_at_the_users_line():
    with pytest.raises(tilews.CompileError, match="must be 'tf32' or 'ieee'") as e:
        k_major_f32(256, 256, 256, "fp64")
    assert e.value.loc.line == k_major_f32.fn.__code__.co_firstlineno + 13
