"""target="metal": the examples compiled to MSL and run through the CPU harness against float64.

Every kernel here is emitted by the Metal backend and executed by ``tilews.metal.harness`` (the
emitted MSL compiled as C++ with one OS thread per lane), outputs poisoned with NaN before the
launch. Then: where lowering put each fragment (registers, simdgroup matrices, shared memory), the
block barriers it placed (a planted bug without them is caught by the thread sanitizer), and the
errors a program Metal cannot run gets.
"""
from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews import CompileError
from tilews.lowering.errors import InternalError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import FragmentStoragePlan
from tilews.metal.backend import METAL, MetalBackend
from tilews.metal import harness
from tilews.metal.source import ATTRIBUTES

from examples.gemm import matmul, persistent_matmul
from examples.softmax import softmax
from examples.ws_gemm import ws_matmul_program
from tilews.ops.attention import mha_fwd_program

from ..helpers import marked_line, poisoned, rel_err
from ..test_fp8 import PAIRS, run_gemm
from .test_launchers import expected_mlx_decls, mlx_source, mx, needs_mlx, split_kernel

pytestmark = pytest.mark.skipif(harness.compiler() is None, reason="needs a C++17 compiler")

DTYPES = {"f16": (T.float16, torch.float16, 2e-3), "bf16": (T.bfloat16, torch.bfloat16, 1e-2),
          "f32": (T.float32, torch.float32, 1e-5)}


def metal(fn):
    return tilews.jit(target="metal")(fn)


def storage(kernel) -> dict:
    return dict(kernel.ir_after.plan(FragmentStoragePlan).storage)


def randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# ----------------------------------------------------------------------------------------------
# the examples, through the harness


@pytest.mark.parametrize("name", DTYPES)
def test_gemm_ragged(name):
    """examples/gemm.py at a shape ragged in M, N and K against float64; the accumulator stays
    in simdgroup matrices and leaves through the masked scratch path."""
    t, dt, tol = DTYPES[name]
    M, N, K = 100, 72, 40
    k = metal(matmul.fn)(M, N, K, block_M=32, block_N=32, block_K=16, dtype=t)
    assert k.report.target == "metal"
    assert storage(k) == {"C_f": "matrix"}
    a, b = randn(M, K, dtype=dt, seed=1), randn(K, N, dtype=dt, seed=2)
    c = poisoned(M, N, dtype=dt)
    k(a, b, c)
    ref = a.double() @ b.double()
    assert c.isfinite().all()
    assert rel_err(c, ref) < tol
    assert "simdgroup_multiply_accumulate" in k.get_kernel_source()


@pytest.mark.parametrize("K", [16, 32, 40, 64])
def test_pipelined_loop_is_double_buffered(K):
    """T.Pipelined(num_stages=3) on Metal: the next tile is loaded into second shared buffers
    while this one is multiplied, one block barrier per tile (two per unrolled pair); 1 to 4
    k-tiles, so both halves and the guards are exercised."""
    M, N = 40, 48
    k = metal(matmul.fn)(M, N, K, block_M=32, block_N=32, block_K=16, dtype=T.float32)
    src = k.get_kernel_source()
    assert "threadgroup float A_s_1[512];" in src and "threadgroup float B_s_1[512];" in src
    loop = src[src.index("for (int k = 0"):]
    assert loop.count("threadgroup_barrier") == 2
    a, b = randn(M, K, seed=20), randn(K, N, seed=21)
    c = poisoned(M, N)
    k(a, b, c)
    assert rel_err(c, a.double() @ b.double()) < 1e-5


def test_double_buffering_that_does_not_fit_is_left_out():
    """A second copy of 16 KB of tiles would pass 32 KB: the loop stays single-buffered, and the
    report says why."""
    k = metal(matmul.fn)(64, 64, 64, block_M=64, block_N=64, block_K=64, dtype=T.float16)
    assert "A_s_1" not in k.get_kernel_source()
    assert any("runs single-buffered" in n for n in k.report.notes)


def test_gemm_in_bounds_stores_matrices_directly():
    """Tiles that divide the shape need no mask: the accumulator is stored with simdgroup_store
    straight to device memory (float32 out: no conversion)."""
    M = N = K = 64
    k = metal(matmul.fn)(M, N, K, block_M=32, block_N=32, block_K=16, dtype=T.float32)
    src = k.get_kernel_source()
    assert "simdgroup_store(C_f[0], (C + " in src and "tws_scratch" not in src
    a, b = randn(M, K, seed=3), randn(K, N, seed=4)
    c = poisoned(M, N)
    k(a, b, c)
    assert rel_err(c, a.double() @ b.double()) < 1e-5


def test_softmax():
    """examples/softmax.py: reductions across simdgroups, row vectors read by every thread."""
    M, N = 50, 64
    k = metal(softmax.fn)(M, N)
    assert storage(k) == {"x": "shared", "row_max": "shared", "row_sum": "shared"}
    x = randn(M, N, seed=5) * 3
    y = poisoned(M, N)
    k(x, y)
    assert rel_err(y, torch.softmax(x.double(), dim=1)) < 1e-5


def test_persistent_gemm():
    """examples/gemm.py's T.Persistent GEMM: 3 blocks loop over 12 output tiles."""
    M, N, K = 100, 72, 48
    k = metal(persistent_matmul.fn)(M, N, K, block_M=32, block_N=32, block_K=16, threads=128,
                                    num_sms=3)
    a, b = randn(M, K, dtype=torch.bfloat16, seed=16), randn(K, N, dtype=torch.bfloat16, seed=17)
    c = poisoned(M, N, dtype=torch.bfloat16)
    k(a, b, c)
    assert rel_err(c, a.double() @ b.double()) < 1e-2


def test_explicit_ws_gemm_runs_as_one_role():
    """examples/ws_gemm.py: the producer T.ws(0) and consumer T.ws(1, 2) become one stream of
    384 threads (the barrier protocol holds in program order)."""
    M, N, K = 64, 64, 48
    k = metal(ws_matmul_program)(M, N, K, block_M=32, block_N=32, block_K=16)
    assert any("despecialize" in n for n in k.report.notes)
    a, b = randn(M, K, dtype=torch.float16, seed=6), randn(K, N, dtype=torch.float16, seed=7)
    c = poisoned(M, N, dtype=torch.float16)
    k(a, b, c)
    assert rel_err(c, a.double() @ b.double()) < 2e-3


def fp8_decode_program(n, fp8):
    @T.prim_func
    def main(X: T.Tensor((n,), fp8), Y: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((n,), T.float32)
            T.copy(X[0], x)
            T.copy(x, Y[0])
    return main


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_decode_every_code(fp8):
    """Every one of the 256 codes, decoded by a tile program (FP8 global -> float32 fragment held
    in registers), equals torch's conversion (NaN where torch has NaN)."""
    tdt = torch.float8_e4m3fn if fp8 == "e4m3" else torch.float8_e5m2
    k = metal(fp8_decode_program)(256, T.float8_e4m3 if fp8 == "e4m3" else T.float8_e5m2)
    assert storage(k) == {"x": "registers"}
    codes = torch.arange(256, dtype=torch.uint8).view(tdt)
    y = poisoned(256)
    k(codes, y)
    want = codes.float()
    assert torch.equal(y.isnan(), want.isnan())
    assert torch.equal(y[~want.isnan()], want[~want.isnan()])


def fp8_encode_program(n, fp8):
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((n,), fp8)):
        with T.Kernel(T.ceildiv(n, 1024), threads=256) as bx:
            for i in T.Parallel(1024):
                Y[bx * 1024 + i] = X[bx * 1024 + i]
    return main


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_encode_matches_torch_bit_for_bit(fp8):
    """float32 -> FP8 stores round as torch does, byte for byte: every FP8 value, every midpoint
    between neighbours (ties to even) and a hair either side, the overflow boundaries, infinities,
    NaN, signed zeros, float32 subnormals and random magnitudes across the whole range."""
    tdt = torch.float8_e4m3fn if fp8 == "e4m3" else torch.float8_e5m2
    values = torch.arange(256, dtype=torch.uint8).view(tdt).float()
    finite = values[values.isfinite()].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    g = torch.Generator().manual_seed(40)
    x = torch.cat([finite, mids, torch.nextafter(mids, torch.full_like(mids, float("inf"))),
                   torch.nextafter(mids, torch.full_like(mids, float("-inf"))),
                   torch.tensor([448.0, 464.0, 479.9, 480.0, 500.0, 57344.0, 61439.0, 61440.0,
                                 65535.0, 65536.0, 1e30, float("inf"), float("nan"), 0.0, -0.0,
                                 1e-40, -1e-42, 2.0 ** -10, 2.0 ** -17]),
                   torch.randn(4000, generator=g) * torch.exp2(torch.randint(-20, 17, (4000,), generator=g).float())])
    x = torch.cat([x, -x])
    k = metal(fp8_encode_program)(x.numel(), T.float8_e4m3 if fp8 == "e4m3" else T.float8_e5m2)
    y = torch.full((x.numel(),), 0x55, dtype=torch.uint8).view(tdt)
    k(x, y)
    got, want = y.view(torch.uint8), x.to(tdt).view(torch.uint8)
    nan = want.view(tdt).float().isnan()
    assert torch.equal(got.view(tdt).float().isnan(), nan)
    assert torch.equal(got[~nan], want[~nan]), x[~nan][got[~nan] != want[~nan]][:8]


@pytest.mark.parametrize("gran", ["tensor-1", "row-2d", "block"])
@pytest.mark.parametrize("pair", ["e4m3-e4m3", "e5m2-e5m2", "e4m3-e5m2"])
def test_fp8_scaled_matmul(gran, pair):
    """T.fp8_scaled_matmul per tensor, per row and block-wise: FP8 tiles decoded to float16 in
    threadgroup memory, half simdgroup MMA, the scales in the epilogue (block-wise: per 128-wide
    k-block into the float32 accumulator)."""
    c, ref = run_gemm("metal", 70, 72, 200, gran, PAIRS[pair], True, torch.float32, False, seed=9)
    assert c.isfinite().all()
    assert rel_err(c, ref) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_attention_small_tiles(causal):
    """TileLang's attention program with 16x16 blocks and head dim 32 (it fits in 32 KB), at a
    sequence length that is not a multiple of the block, against float64 softmax attention."""
    B, H, S, D = 1, 2, 40, 32
    k = metal(mha_fwd_program)(B, H, S, D, causal, block_M=16, block_N=16, num_stages=1,
                               threads=128)
    q, kk, v = (randn(B, H, S, D, dtype=torch.float16, seed=s) for s in (10, 11, 12))
    o = poisoned(B, H, S, D, dtype=torch.float16)
    k(q, kk, v, o)
    scores = (q.double() @ kk.double().transpose(-1, -2)) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(scores, -1) @ v.double()
    assert o.isfinite().all()
    assert rel_err(o, ref) < 1e-2


# ----------------------------------------------------------------------------------------------
# where fragments live


def elementwise_program(n, m):
    @T.prim_func
    def main(X: T.Tensor((n, m), T.float32), Y: T.Tensor((n, m), T.float32)):
        with T.Kernel(1, threads=64) as bx:
            x = T.alloc_fragment((n, m), T.float32)
            scale = T.alloc_local((1,), T.float32)
            scale[0] = 3.0
            T.copy(X[0, 0], x)
            for i, j in T.Parallel(n, m):
                x[i, j] = x[i, j] * scale[0] + i
            T.copy(x, Y[0, 0])
    return main


def test_registers_and_replicated():
    """A fragment read and written only at a T.Parallel's own indices stays in registers (no
    barrier needed between its statements); a small one written outside T.Parallel is replicated."""
    k = metal(elementwise_program)(10, 12)
    assert storage(k) == {"x": "registers", "scale": "replicated"}
    assert "threadgroup_barrier" not in k.get_kernel_source()
    x = randn(10, 12, seed=13)
    y = poisoned(10, 12)
    k(x, y)
    assert torch.allclose(y, x * 3 + torch.arange(10).reshape(10, 1), atol=1e-6)


def test_without_a_compiler_compiling_works_and_a_call_says_what_is_missing(monkeypatch):
    monkeypatch.setenv("TILEWS_CXX", "no-such-c++-compiler")
    k = metal(matmul.fn)(32, 32, 32, block_M=32, block_N=32, block_K=16, dtype=T.float32)
    assert "simdgroup_multiply_accumulate" in k.get_kernel_source()
    with pytest.raises(harness.HarnessUnavailable, match="needs a C\\+\\+17 compiler.*TILEWS_CXX"):
        k(randn(32, 32), randn(32, 32), poisoned(32, 32))


def epilogue_program(M, N, K, reduce_rows=False, block=32):
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             Bias: T.Tensor((N,), T.float32), C: T.Tensor((M, N), T.float16),
             R: T.Tensor((M,), T.float32)):
        with T.Kernel(T.ceildiv(N, block), T.ceildiv(M, block), threads=128) as (bx, by):
            A_s = T.alloc_shared((block, 32), T.float16)
            B_s = T.alloc_shared((32, block), T.float16)
            C_f = T.alloc_fragment((block, block), T.float32)
            D_f = T.alloc_fragment((block, block), T.float32)
            r = T.alloc_fragment((block,), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=2):
                T.copy(A[by * block, k * 32], A_s)
                T.copy(B[k * 32, bx * block], B_s)
                T.gemm(A_s, B_s, C_f)
            for i, j in T.Parallel(block, block):
                D_f[i, j] = T.max(C_f[i, j] * 2.0 + Bias[bx * block + j], 0.0)
            if reduce_rows:
                T.reduce_sum(D_f, r, dim=1)
                for i in T.Parallel(block):
                    T.atomic_add(R[by * block + i], r[i])
            T.copy(D_f, C[by * block, bx * block])
    return main


@pytest.mark.parametrize("reduce_rows", [False, True])
def test_fused_epilogue_on_matrices(reduce_rows):
    """A fused epilogue (relu(2 * acc + bias)) over the gemm accumulator runs per simdgroup tile
    through scratch; the fragment it writes joins the matrices, unless it is also reduced
    (then it lives in shared memory). Ragged M and N."""
    M, N, K = 70, 40, 64
    k = metal(epilogue_program)(M, N, K, reduce_rows)
    want = {"C_f": "matrix", "D_f": "shared" if reduce_rows else "matrix",
            "r": "shared" if reduce_rows else "registers"}
    assert storage(k) == want
    a, b = randn(M, K, dtype=torch.float16, seed=30), randn(K, N, dtype=torch.float16, seed=31)
    bias = randn(N, seed=32)
    c, r = poisoned(M, N, dtype=torch.float16), torch.zeros(M)
    k(a, b, bias, c, r)
    ref = torch.relu(2 * (a.double() @ b.double()) + bias.double())
    assert rel_err(c, ref) < 2e-3
    if reduce_rows:
        assert rel_err(r, ref.sum(1)) < 1e-5


def test_missing_barriers_are_caught_by_the_thread_sanitizer(monkeypatch):
    """The planted bug: without insert_syncs, the harness under the thread sanitizer reports the
    race between the copy into shared memory and the gemm reading it."""
    monkeypatch.setattr(MetalBackend, "pipeline", MetalBackend.pipeline.without("insert_syncs"))
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1")     # the cached kernel has its barriers
    k = metal(matmul.fn)(32, 32, 32, block_M=32, block_N=32, block_K=16, dtype=T.float32)
    assert "threadgroup_barrier" not in k.get_kernel_source()
    built = harness.build(k.program.msl, sanitizer="thread")
    a, b, c = randn(32, 32, seed=14), randn(32, 32, seed=15), poisoned(32, 32)
    with pytest.raises(harness.HarnessError, match="(?i)data race"):
        built.run([a, b, c], (1, 1, 1))


# ----------------------------------------------------------------------------------------------
# what Metal cannot run


def gemm_program(M, N, K, block, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block), T.ceildiv(M, block), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block, K), T.float16)
            B_s = T.alloc_shared((K, block), T.float16)
            C_f = T.alloc_fragment((block, block), T.float32)
            T.copy(A[by * block, 0], A_s)
            T.copy(B[0, bx * block], B_s)
            T.gemm(A_s, B_s, C_f, clear_accum=True)
            T.copy(C_f, C[by * block, bx * block])
    return main


@pytest.mark.parametrize("args, match", [
    ((64, 64, 64, 32, 100), "multiple of 32"),
    ((64, 64, 64, 12), "multiples of 8"),
    ((128, 128, 160, 64), "(?s)40960 bytes of shared memory.*A_s.*B_s"),
    ((32, 32, 32, 32, 2048), "to 1024"),
], ids=["threads-not-simd-multiple", "tile-not-multiple-of-8", "over-32KB", "too-many-threads"])
def test_errors(args, match):
    with pytest.raises(CompileError, match=match):
        metal(gemm_program)(*args)


def test_fragments_count_against_threadgroup_memory():
    """Fragments that live in shared memory (attention's scores and output accumulator) count
    against the 32 KB too; the error names the largest buffers."""
    with pytest.raises(CompileError, match=r"(?s)threadgroup memory on target 'metal'.*largest: "
                                           r"(Q_shared|O_shared|acc_s|acc_o)"):
        metal(mha_fwd_program)(1, 2, 128, 64, False, block_M=64, block_N=32, num_stages=1,
                               threads=128)


@needs_mlx
def test_mlx_accepts_an_emitted_kernel(capfd, tmp_path):
    """The emitted gemm's body and header go to mlx's metal_kernel unchanged, and the signature
    mlx writes (mx.export_function tracing; no Metal needed) has our parameters and the thread
    attributes the body reads."""
    k = metal(matmul.fn)(64, 64, 48, block_M=32, block_N=32, block_K=16)
    msl = k.program.msl
    args = [mx.zeros((64, 48), dtype=mx.float16), mx.zeros((48, 64), dtype=mx.float16), (64, 64)]
    source = mlx_source(msl, args, k.program.grid([None] * 3), capfd, tmp_path)
    _, _, decls, body = split_kernel(source)
    assert decls[:3] == expected_mlx_decls(msl)
    assert sorted(decls[3:]) == sorted(f"{ATTRIBUTES[a]} {a} [[{a}]]" for a in msl.attributes)
    assert body.rstrip("\n") == msl.body.rstrip("\n")


# ----------------------------------------------------------------------------------------------
# what Metal cannot spell: legalize_metal refuses it at the user's line, before the emitter


def f64_buffer():
    @T.prim_func
    def main(A: T.Tensor((16,), T.float64)):  # <- error
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(16):
                A[i] = 1.0
    return main


def f64_scalar():
    @T.prim_func
    def main(A: T.Tensor((16,), T.float32), s: T.float64):  # <- error
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(16):
                A[i] = A[i] + 1.0
    return main


def f64_local():
    @T.prim_func
    def main(A: T.Tensor((16,), T.float32)):
        with T.Kernel(1, threads=32) as bx:
            L = T.alloc_local((4,), T.float64)  # <- error
            L[0] = 1.0
            for i in T.Parallel(16):
                A[i] = L[0]
    return main


def f64_cast():
    @T.prim_func
    def main(A: T.Tensor((16,), T.float32)):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(16):
                A[i] = T.cast(T.cast(A[i], T.float64) * 2, T.float32)  # <- error
    return main


def atomic_return_prev():
    @T.prim_func
    def main(A: T.Tensor((16,), T.int32), B: T.Tensor((16,), T.int32)):
        with T.Kernel(1, threads=32) as bx:
            p = T.atomic_add(A[0], 1, return_prev=True)  # <- error
            for i in T.Parallel(1):
                B[i] = p
    return main


def atomic_ordered():
    @T.prim_func
    def main(A: T.Tensor((16,), T.int32)):
        with T.Kernel(1, threads=32) as bx:
            T.atomic_add(A[0], 1, memory_order="release")  # <- error
    return main


def atomic_f16():
    @T.prim_func
    def main(A: T.Tensor((16,), T.float16)):
        with T.Kernel(1, threads=32) as bx:
            T.atomic_add(A[0], 1.0)  # <- error
    return main


def atomic_f16_tile():
    @T.prim_func
    def main(A: T.Tensor((64,), T.float16), B: T.Tensor((64,), T.float16)):
        with T.Kernel(1, threads=32) as bx:
            F = T.alloc_fragment((64,), T.float16)
            T.copy(A[0:64], F)
            T.atomic_add(B[0:64], F)  # <- error
    return main


F64 = "float64 has no Metal type (Metal has no 64-bit floats); use float32"


@pytest.mark.parametrize("program, message", [
    (f64_buffer, F64), (f64_scalar, F64), (f64_local, F64), (f64_cast, F64),
    (atomic_return_prev, "T.atomic_add into 'A' with return_prev=True: the Metal backend spells "
                         "relaxed adds that return nothing"),
    (atomic_ordered, "T.atomic_add into 'A' with memory_order='release': the Metal backend spells "
                     "relaxed adds that return nothing"),
    (atomic_f16, "T.atomic_add into 'A' (global, float16): Metal adds atomically to float32, int32 "
                 "and uint32 in global memory"),
    (atomic_f16_tile, "T.atomic_add into 'B' (global, float16): Metal adds atomically to float32, "
                      "int32 and uint32 in global memory"),
], ids=["f64-buffer", "f64-scalar", "f64-local", "f64-cast", "atomic-return-prev",
        "atomic-ordered", "atomic-f16", "atomic-f16-tile"])
def test_what_metal_cannot_spell_is_refused_at_the_users_line(program, message):
    with pytest.raises(CompileError) as info:
        metal(program)()
    e = info.value
    assert type(e) is CompileError, repr(e)          # a user error, not an InternalError
    assert e.message == message
    assert e.loc.file == __file__ and e.loc.line == marked_line(program), str(e)
    assert "legalize_metal" not in str(e) and "emit.py" not in str(e), str(e)
    # lowering refuses it (legalize_metal): the emitter never sees the program
    with pytest.raises(CompileError, match=re.escape(message)):
        lower(build_kernel(program()), METAL, upto="legalize_metal")


def test_the_emitter_raises_only_internal_errors():
    """A program lowering did not refuse but the emitter cannot spell is a bug of lowering: the
    emitter says so with an InternalError (here: the plan without its decision for a copy)."""
    from tilews.metal.emit import emit
    lowered = lower(build_kernel(matmul.fn(64, 64, 48, block_M=32, block_N=32, block_K=16)),
                           METAL)
    plan = lowered.plan(FragmentStoragePlan)
    broken = lowered.with_plan(dataclasses.replace(plan, matrix_copies=()))
    with pytest.raises(InternalError, match="no decision for the copy out of matrix buffer 'C_f'"):
        emit(broken)


def scalar_stores(n):
    """B[0] = sum(A), B[1] = 2 A[3]: stores of single elements outside any T.Parallel."""
    @T.prim_func
    def main(A: T.Tensor((n,), T.float32), B: T.Tensor((2,), T.float32)):
        with T.Kernel(1, threads=32) as bx:
            frag = T.alloc_fragment((n,), T.float32)
            total = T.alloc_fragment((1,), T.float32)
            T.copy(A[0:n], frag)
            T.reduce_sum(frag, total, dim=0)
            B[0] = total[0]
            B[1] = A[3] * 2.0
    return main


def accumulator_element():
    """C[0] = (A A)[0, 0]: one element of a gemm's accumulator stored outside a T.Parallel."""
    @T.prim_func
    def main(A: T.Tensor((16, 16), T.float16), C: T.Tensor((1,), T.float32)):
        with T.Kernel(1, threads=32) as bx:
            A_s = T.alloc_shared((16, 16), T.float16)
            acc = T.alloc_fragment((16, 16), T.float32)
            T.copy(A, A_s)
            T.gemm(A_s, A_s, acc, clear_accum=True)
            C[0] = acc[0, 0]
    return main


def test_scalar_stores_outside_a_parallel():
    """They were an InternalError (legalize_metal keyed each T.Parallel by its first variable;
    the frontend's loop around a scalar statement has none)."""
    a = randn(32, seed=7)
    b = poisoned(2)
    metal(scalar_stores(32))(a, b)
    assert torch.allclose(b[0], a.double().sum().float(), atol=1e-5, rtol=1e-5), b
    assert b[1] == a[3] * 2
    m = randn(16, 16, dtype=torch.float16, seed=8)
    c = poisoned(1)
    metal(accumulator_element)()(m, c)
    want = (m.double() @ m.double())[0, 0]
    assert torch.allclose(c.double(), want.reshape(1), atol=1e-3, rtol=1e-3), (c, want)
