"""The thread level on the ``triton.language`` backend (issue 39).

Numerics on ``target="triton"`` (Triton's CPU interpreter here) against float64 references, random
inputs, outputs poisoned: every GEMV form of TileLang's ``gemv`` example that needs no thread
reduction intrinsic (naive, naive split-K, split-K, split-K vectorized), a per-thread loop whose
trip count comes from a tensor, a per-thread branch writing global memory, per-thread atomic adds
into shared and into global memory (also at shared indices computed from two thread dims).

Compile-only for ``GPUTarget("cuda", 90, 32)`` (the ``tl`` path on Hopper; no GPU needed): the
vectorized split-K GEMV loads B with 128-bit loads, keeps each thread's ``TILE_K`` elements in
that thread (TTGIR layout) and reads them without shuffles or a gather. Those builds run in a
subprocess without ``TRITON_INTERPRET`` (``python -m tests.test_threads_tl compile``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import poisoned, randn
from .thread_programs import naive_gemv, splitk_gemv

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# programs, written as TileLang's gemv examples write them


def naive_splitk_gemv(N, K, BLOCK_N, BLOCK_K, dtype=T.float16, accum_dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((K,), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, BLOCK_N), threads=(BLOCK_N, BLOCK_K)) as bn:
            tn = T.get_thread_binding(0)
            tk = T.get_thread_binding(1)
            A_local = T.alloc_local((1,), dtype)
            B_local = T.alloc_local((1,), dtype)
            C_accum = T.alloc_local((1,), accum_dtype)
            C_shared = T.alloc_shared((BLOCK_N,), accum_dtype)
            if tk == 0:
                C_shared[tn] = 0
            T.clear(C_accum)
            for bk in T.serial(T.ceildiv(K, BLOCK_K)):
                A_local[0] = A[bk * BLOCK_K + tk]
                B_local[0] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk]
                C_accum[0] += A_local[0].astype(accum_dtype) * B_local[0].astype(accum_dtype)
            T.atomic_add(C_shared[tn], C_accum[0])
            C[bn * BLOCK_N + tn] = C_shared[tn]
    return main


def tl_splitk_gemv(N, K, BLOCK_N, BLOCK_K, reduce_threads, vectorized=False, dtype=T.float16):
    """TileLang's ``splitk_gemv`` (``vectorized``: ``splitk_gemv_vectorized``), given its
    ``BLOCK_K`` as the example's callers do."""
    return splitk_gemv(N, K, BLOCK_N, reduce_threads, T.ceildiv(BLOCK_K, reduce_threads),
                       vectorized=vectorized, dtype=dtype)


def splitk_gemv_vectorized(N, K, BLOCK_N, reduce_threads, dtype=T.float16):
    TILE_K = 128 // 16
    return tl_splitk_gemv(N, K, BLOCK_N, reduce_threads * TILE_K, reduce_threads, vectorized=True,
                          dtype=dtype)


def ragged_row_sums(R, W, threads=64):
    """Thread t sums the first ``counts[t]`` elements of row t: a loop whose trip count each
    thread reads from a tensor."""
    @T.prim_func
    def main(X: T.Tensor((R, W), T.float32), counts: T.Tensor((R,), T.int32),
             Y: T.Tensor((R,), T.float32)):
        with T.Kernel(T.ceildiv(R, threads), threads=threads) as bx:
            tx = T.get_thread_binding(0)
            acc = T.alloc_var(T.float32)
            acc = 0.0
            for i in T.serial(counts[bx * threads + tx]):
                acc += X[bx * threads + tx, i]
            Y[bx * threads + tx] = acc
    return main


def branch_writes(N, threads=128):
    """Each thread writes either ``2x`` or ``-x`` to its element, by the sign of its input, and
    odd threads also write a flag: branches on per-thread conditions storing to global memory."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((N,), T.float32),
             F: T.Tensor((N,), T.int32)):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            tx = T.get_thread_binding(0)
            i = bx * threads + tx
            if X[i] > 0:
                Y[i] = X[i] * 2.0
            else:
                Y[i] = -X[i]
            if tx % 2 == 1:
                F[i] = tx
            else:
                F[i] = -1
    return main


def histogram(N, BINS, threads=128):
    """Per-thread atomic adds: each thread adds its value into a shared bin picked by its label
    (a scatter-add several threads hit at once), then the block adds its bins into global ones;
    each thread also adds its value into a global total."""
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), L: T.Tensor((N,), T.int32),
             H: T.Tensor((BINS,), T.float32), S: T.Tensor((1,), T.float32)):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            tx = T.get_thread_binding(0)
            bins = T.alloc_shared((BINS,), T.float32)
            if tx < BINS:
                bins[tx] = 0
            T.atomic_add(bins[L[bx * threads + tx]], X[bx * threads + tx])
            if tx < BINS:
                T.atomic_add(H[tx], bins[tx])
            T.atomic_add(S[0], X[bx * threads + tx])
    return main


def histogram_2d(N, BINS):
    """The histogram on threads=(32, 4), bins laid out (2, BINS // 2): every shared index reads
    both thread indices (a thread's flat number ``ty * 32 + tx``)."""
    H = BINS // 2

    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), L: T.Tensor((N,), T.int32),
             Y: T.Tensor((2, H), T.float32)):
        with T.Kernel(T.ceildiv(N, 128), threads=(32, 4)) as bx:
            tx = T.get_thread_binding(0)
            ty = T.get_thread_binding(1)
            t = ty * 32 + tx
            bins = T.alloc_shared((2, H), T.float32)
            if t < BINS:
                bins[t // H, t % H] = 0
            label = L[bx * 128 + t]
            T.atomic_add(bins[label // H, label % H], X[bx * 128 + t])
            if t < BINS:
                T.atomic_add(Y[t // H, t % H], bins[t // H, t % H])
    return main


# ----------------------------------------------------------------------------------------------
# numerics on target="triton"


def _gemv_ref(A, B):
    return B.double() @ A.double()


GEMVS = {
    "naive": lambda N, K: naive_gemv(N, K, 128, 32),
    "naive_splitk": lambda N, K: naive_splitk_gemv(N, K, 32, 32),
    "splitk": lambda N, K: tl_splitk_gemv(N, K, 32, 32, 8),
    "splitk_vectorized": lambda N, K: splitk_gemv_vectorized(N, K, 2, 32),
}


@pytest.mark.parametrize("form", sorted(GEMVS))
def test_gemv_forms(form):
    N, K = 256, 512
    kernel = tilews.compile(GEMVS[form](N, K), target="triton")
    A, B = randn(K, dtype=torch.float16, seed=1), randn(N, K, dtype=torch.float16, seed=2)
    C = poisoned(N, dtype=torch.float16)
    kernel(A, B, C)
    ref = _gemv_ref(A, B)
    # fp16 output of fp32 sums of K=512 products: the output's rounding dominates
    torch.testing.assert_close(C.double(), ref, rtol=2e-3, atol=2e-2)


def test_ragged_per_thread_loop():
    R, W = 100, 40
    X = randn(R, W, seed=3)
    counts = torch.randint(0, W + 1, (R,), generator=torch.Generator().manual_seed(4),
                           dtype=torch.int32)
    Y = poisoned(R)
    tilews.compile(ragged_row_sums(R, W), target="triton")(X, counts, Y)
    ref = torch.stack([X[r, :counts[r]].double().sum() for r in range(R)])
    torch.testing.assert_close(Y.double(), ref, rtol=1e-5, atol=1e-5)


def test_per_thread_branch_writes_global():
    N = 300
    X = randn(N, seed=5)
    Y, F = poisoned(N), poisoned(N, dtype=torch.int32)
    tilews.compile(branch_writes(N), target="triton")(X, Y, F)
    torch.testing.assert_close(Y.double(), torch.where(X > 0, 2 * X.double(), -X.double()))
    t = torch.arange(N) % 128
    assert torch.equal(F, torch.where(t % 2 == 1, t, -1).to(torch.int32))


def test_per_thread_atomics_into_shared_and_global():
    N, BINS = 384, 8
    X = randn(N, seed=6)
    L = torch.randint(0, BINS, (N,), generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    H, S = torch.zeros(BINS), torch.zeros(1)
    tilews.compile(histogram(N, BINS), target="triton")(X, L, H, S)
    ref = torch.zeros(BINS, dtype=torch.float64).index_add_(0, L.long(), X.double())
    torch.testing.assert_close(H.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S.double(), X.double().sum().reshape(1), rtol=1e-5, atol=1e-4)


def test_per_thread_shared_indices_of_two_thread_dims():
    N, BINS = 256, 16
    X = randn(N, seed=8)
    L = torch.randint(0, BINS, (N,), generator=torch.Generator().manual_seed(9), dtype=torch.int32)
    Y = torch.zeros(2, BINS // 2)
    tilews.compile(histogram_2d(N, BINS), target="triton")(X, L, Y)
    ref = torch.zeros(BINS, dtype=torch.float64).index_add_(0, L.long(), X.double())
    torch.testing.assert_close(Y.double().reshape(-1), ref, rtol=1e-5, atol=1e-5)


def chunked_unpack(rows, cols, threads=128, local=4):
    """TileLang's per-thread dequantization shape: each thread unpacks ``local`` values per round
    and stores them at flat offsets ``round * threads * local + tx * local + v`` of a shared tile
    (``S[e // cols, e % cols]``), then the tile is copied out."""
    rounds = rows * cols // (threads * local)

    @T.prim_func
    def main(X: T.Tensor((rows, cols), T.int32), Y: T.Tensor((rows, cols), T.float32)):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            S = T.alloc_shared((rows, cols), T.float32)
            vals = T.alloc_local((local,), T.float32)
            for i in T.serial(rounds):
                for v in T.vectorized(local):
                    e = i * threads * local + tx * local + v
                    vals[v] = T.cast(X[e // cols, e % cols] * 3 - 1, T.float32)
                for v in T.vectorized(local):
                    e = i * threads * local + tx * local + v
                    S[e // cols, e % cols] = vals[v]
            T.copy(S, Y)
    return main


@pytest.mark.parametrize("rows,cols", [(16, 64), (64, 128)])
def test_per_thread_stores_of_aligned_runs_into_a_shared_tile(rows, cols):
    X = torch.randint(-50, 50, (rows, cols), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    Y = poisoned(rows, cols)
    tilews.compile(chunked_unpack(rows, cols), target="triton")(X, Y)
    assert torch.equal(Y, (X * 3 - 1).float())
    # the store is the round's values placed as one chunk, not a one-hot over the tile
    source = tilews.compile(chunked_unpack(rows, cols), target="triton").get_kernel_source()
    assert "chunk" in source and f"{rows * cols}" not in source.split("chunk", 1)[1].split("\n")[0]


# ----------------------------------------------------------------------------------------------
# compile-only for sm_90 (the tl path on Hopper)


SM90 = {**{form: lambda f=f: f(1024, 1024) for form, f in GEMVS.items()},
        "ragged": lambda: ragged_row_sums(1024, 64), "branch": lambda: branch_writes(1024),
        "histogram": lambda: histogram(1024, 16), "histogram_2d": lambda: histogram_2d(1024, 16)}


def _compile_sm90(name: str, out: str) -> None:
    """Build program ``name`` of ``SM90`` for sm_90 as Triton's JIT specializes contiguous,
    16-byte aligned tensors at launch (pointers and strides divisible by 16 hinted so, strides of
    1 constants), and write its TTGIR and PTX to ``out`` (JSON)."""
    import importlib.util
    import json
    import math

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tilews.lowering.frontend import build_kernel
    from tilews.lowering.pipeline import lower
    from tilews.lowering.plans import StreamPlan
    from tilews.triton_ext.tl import emit
    from tilews.triton_ext.tl.backend import TRITON_GPU

    from .helpers import services

    lowered = lower(build_kernel(SM90[name]()), TRITON_GPU)
    spec = importlib.util.spec_from_file_location("tilews_threads_tl",
                                                  services().store.source_file(emit(lowered)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signature, constants, attrs = {}, {}, {}
    for p in lowered.params:            # (every parameter a tensor of static shape)
        attrs[(len(signature),)] = [["tt.divisibility", 16]]
        signature[p.name] = "*" + {"f16": "fp16", "f32": "fp32", "i32": "i32"}[p.dtype.value]
        shape = [int(d.value) for d in p.shape]
        for d in range(len(shape)):
            stride, at = math.prod(shape[d + 1:]), (len(signature),)
            if stride == 1:
                constants[at] = 1
            elif stride % 16 == 0:
                attrs[at] = [["tt.divisibility", 16]]
            signature[f"{p.name}_stride{d}"] = "constexpr" if stride == 1 else "i32"
    fn = triton.jit(getattr(module, lowered.name))
    compiled = triton.compile(ASTSource(fn, signature, constants, attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": lowered.plan(StreamPlan).num_warps})
    with open(out, "w") as f:
        json.dump({k: compiled.asm[k] for k in ("ttgir", "ptx")}, f)


def _sm90(name: str, tmp_path) -> dict:
    import json
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "tests.test_threads_tl", "compile", name, str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def _ops(ptx: str, op: str) -> int:
    """How many instructions of (a part of) a kernel's PTX are ``op`` (``op`` or ``op.*``)."""
    return len(re.findall(rf"^\s*(?:@%p\d+\s+)?{re.escape(op)}(?![\w])", ptx, re.M))


@pytest.mark.parametrize("name", sorted(SM90))
def test_compiles_for_sm90(name, tmp_path):
    ptx = _sm90(name, tmp_path)["ptx"]
    assert ".entry main" in ptx
    if name in GEMVS:       # the K loop's products: one FMA each, whatever reads the operands
        assert _ops(ptx, "fma.rn.f32") > 0
    if name == "histogram":  # the block's bins, then the total: adds at device scope
        assert _ops(ptx, "atom.global.gpu.relaxed.add.f32") >= 2, ptx


def test_vectorized_splitk_gemv_on_sm90(tmp_path):
    """BLOCK_N=2, reduce_threads=32 (64 threads), TILE_K=8 halves: each thread loads its 8
    elements of B (and of A) with one 128-bit load and multiplies them where they lie."""
    asm = _sm90("splitk_vectorized", tmp_path)
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    loads = re.findall(r"tt\.load %[^\s,]+[^:\n]* : tensor<32x2x8x!tt\.ptr<f16>, (#\w+)>", ttgir)
    assert len(loads) == 2, ttgir          # A and B, each at the loop's whole (thread) shape
    for layout in set(loads):
        spec = re.search(rf"^{layout} = #ttg\.blocked<\{{(.*)\}}>", ttgir, re.M).group(1)
        # the 8 elements of a thread's TILE_K dim in that thread's registers
        assert "sizePerThread = [1, 1, 8]" in spec and "threadsPerWarp = [32, 1, 1]" in spec, spec
        assert re.search(r"warpsPerCTA = \[\d+, \d+, 1\]", spec), spec
    # every global load a 128-bit one, unmasked (the indices stay inside A and B: bounds known
    # from the loops' ranges), two per iteration of the K loop (LLVM unrolls its 4 iterations)
    loads = len(re.findall(r"^\s*ld\.global\S*\.v4\.b32", ptx, re.M))
    assert loads == _ops(ptx, "ld.global") and loads % 2 == 0 and loads >= 2, ptx
    assert "@%p" not in "".join(re.findall(r"^.*ld\.global.*$", ptx, re.M))
    # B streams through the block's own rows: marked first to evict; A (every block's) is not
    assert _ops(ptx, "ld.global.L1::evict_first.L2::cache_hint.v4.b32") == loads // 2
    # A_local[t, k] / B_local[t, k] at the serial k: no gather, no shuffle, no select, no add;
    # from the loads to the last product, 8 products per pair of loads and their operands'
    # conversions
    assert "tt.gather" not in ttgir.split("scf.for", 1)[-1]
    products = re.split(r"ld\.global\S*\.v4\.b32", ptx, maxsplit=1)[1].rsplit("fma.rn.f32", 1)[0] + "fma.rn.f32"
    assert _ops(products, "fma.rn.f32") == _ops(ptx, "fma.rn.f32") == 4 * loads
    assert _ops(products, "cvt.f32.f16") == 8 * loads
    for op in ("selp", "sub", "shfl", "st", "bar"):
        assert _ops(products, op) == 0, (op, products)
    # the block's sum into C_shared: a butterfly over the 32 reduce threads, once
    assert _ops(ptx, "shfl.sync.bfly.b32") == 5


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        _compile_sm90(*sys.argv[2:])
