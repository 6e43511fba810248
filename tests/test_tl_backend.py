"""The triton.language backend: numerics, emitted source, errors, and compile-only GPU builds.

Numerics run under Triton's CPU interpreter against float64 torch references (outputs poisoned with
NaN, random inputs, tolerances stated per case). Triton's interpreter must be chosen before triton
is first imported and other test modules import triton without it, so each numeric case runs in
its own process: ``python -m tests.test_tl_backend run <case>``. The same cases also compile for
``GPUTarget("cuda", 90, 32)`` without a GPU (``compile <case>``), and run on a CUDA machine with
``python -m tests.test_tl_backend gpu`` (a table of max errors and times).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.triton_ext.tl.backend import TRITON_CPU, TRITON_GPU
from tilews.triton_ext.tl import emit

from examples.ws_gemm import ws_matmul_program

from .helpers import load, marked_line, poisoned, randn, services

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# kernels


def gemm(M, N, K, dtype, bm=32, bn=32, bk=32, transpose_b=False, swizzle=0, stages=3):
    """C = A @ B (B given as [N, K] with transpose_b), TileLang style."""
    b_shape, bs_shape = ((N, K), (bn, bk)) if transpose_b else ((K, N), (bk, bn))

    @T.prim_func
    def main(A, B, C):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            if swizzle:
                T.use_swizzle(swizzle)
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared(bs_shape, dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, k * bk], A_s)
                if transpose_b:
                    T.copy(B[bx * bn, k * bk], B_s)
                else:
                    T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f, transpose_B=transpose_b)
            T.copy(C_f, C[by * bm, bx * bn])
    return build_kernel(main, {"A": T.Tensor((M, K), dtype), "B": T.Tensor(b_shape, dtype),
                               "C": T.Tensor((M, N), dtype)})


def softmax(M, N, bm=16, bn=64):
    """Row softmax in three passes over column tiles: running max, sum of exponentials, output.
    Ragged rows and columns are guarded element-wise (-inf fill, masked stores)."""
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, bm), threads=128) as bx:
            x = T.alloc_fragment((bm, bn), T.float32)
            mx = T.alloc_fragment((bm,), T.float32)
            total = T.alloc_fragment((bm,), T.float32)
            T.fill(mx, -T.infinity(T.float32))
            T.clear(total)
            for c in T.serial(T.ceildiv(N, bn)):
                for i, j in T.Parallel(bm, bn):
                    x[i, j] = T.if_then_else(c * bn + j < N, X[bx * bm + i, c * bn + j],
                                             -T.infinity(T.float32))
                T.reduce_max(x, mx, dim=1, clear=False)
            for c in T.serial(T.ceildiv(N, bn)):
                for i, j in T.Parallel(bm, bn):
                    x[i, j] = T.if_then_else(c * bn + j < N,
                                             T.exp(X[bx * bm + i, c * bn + j] - mx[i]), 0.0)
                T.reduce_sum(x, total, dim=1, clear=False)
            for c in T.serial(T.ceildiv(N, bn)):
                for i, j in T.Parallel(bm, bn):
                    if bx * bm + i < M and c * bn + j < N:
                        Y[bx * bm + i, c * bn + j] = T.exp(X[bx * bm + i, c * bn + j] - mx[i]) / total[i]
    return build_kernel(main)


def axpy():
    """z = alpha * x + y over a T.dynamic length (direct style: specs from the call)."""
    @T.prim_func
    def main(X, Y, Z, alpha):
        n = X.shape[0]
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            for i in T.Parallel(128):
                if bx * 128 + i < n:
                    Z[bx * 128 + i] = alpha * X[bx * 128 + i] + Y[bx * 128 + i]
    vec = T.Tensor((T.dynamic("n"),), T.float32)
    return build_kernel(main, {"X": vec, "Y": vec, "Z": vec, "alpha": T.float32})


def group_rows(N, G):
    """Rows shifted by their group's offset (grouped GEMM's lookup): the group found with a
    T.alloc_var, then its offset read (a scalar load) inside the parallel loop's `if`."""
    @T.prim_func
    def main(A: T.Tensor((N, 64), T.float32), offs: T.Tensor((G,), T.int32),
             C: T.Tensor((N, 64), T.float32)):
        with T.Kernel(T.ceildiv(N, 32), threads=128) as bx:
            g = T.alloc_var(T.int32)
            for i in range(G):
                g = T.if_then_else(bx * 32 >= offs[i], i, g)
            for i, j in T.Parallel(32, 64):
                if bx * 32 + i < N:
                    C[bx * 32 + i, j] = A[bx * 32 + i, j] + offs[g]
    return build_kernel(main)


def varlen_writes(lens, BM=16, C=16):
    """Ragged rows found through loaded ``cu_seqlens`` bounds (varlen attention's epilogue), with
    writes inside T.Parallel whose addresses span fewer loop axes than the ``if``s around them:
    a row sum under ``if j == 0`` (address over i, mask over i and j), a per-block scalar under
    ``if i == 0`` (a scalar address under a block mask), and an atomic add per valid element."""
    B, R, blocks = len(lens), sum(lens), -(-max(lens) // BM)

    @T.prim_func
    def main(X: T.Tensor((R, C), T.float32), cu: T.Tensor((B + 1,), T.int32),
             Y: T.Tensor((R, C), T.float32), S: T.Tensor((R,), T.float32),
             F: T.Tensor((B, blocks), T.float32), Tot: T.Tensor((B,), T.float32)):
        with T.Kernel(blocks, B, threads=128) as (bx, bz):
            start = cu[bz]
            n = cu[bz + 1] - start
            x = T.alloc_fragment((BM, C), T.float32)
            s = T.alloc_fragment((BM,), T.float32)
            T.copy(X[start + bx * BM:start + bx * BM + BM, :], x)
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(BM, C):
                if bx * BM + i < n:
                    Y[start + bx * BM + i, j] = x[i, j] - s[i]
                    if j == 0:
                        S[start + bx * BM + i] = s[i]
                    T.atomic_add(Tot[bz], x[i, j])
            for i in T.Parallel(BM):
                if i == 0:
                    F[bz, bx] = T.cast(n - bx * BM, T.float32)
    return build_kernel(main)


def split_k(M, N, K, splits, bm=32, bn=32, bk=32):
    """C += A @ B with K split over a third grid axis, accumulated with a tile T.atomic_add."""
    steps = K // bk // splits

    @T.prim_func
    def main(A, B, C):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), splits, threads=128) as (bx, by, bz):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.serial(bz * steps, bz * steps + steps):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            T.atomic_add(C[by * bm, bx * bn], C_f)
    return build_kernel(main, {"A": T.Tensor((M, K), T.float16), "B": T.Tensor((K, N), T.float16),
                               "C": T.Tensor((M, N), T.float32)})


def last_block_sum(G, N=64, grid_order=False):
    """Each of G blocks stores its partial row and counts itself (acq_rel, return_prev); the block
    that arrives last sums the partials in block order into Y and puts the count back to 0.
    Order[b] is the count block b saw. ``grid_order``: wrong, the grid's last block sums (as if
    it always arrived last)."""
    @T.prim_func
    def main(X, P, Count, Order, Y):
        with T.Kernel(G, threads=128) as bx:
            for j in T.Parallel(N):
                P[bx, j] = X[bx, j] * 2.0
            seen = T.atomic_add(Count[0], 1, memory_order="acq_rel", return_prev=True)
            for j in T.Parallel(1):
                Order[bx + j] = seen
            last = bx == G - 1 if grid_order else seen == G - 1
            if last:
                acc = T.alloc_fragment((N,), T.float32)
                T.clear(acc)
                for g in T.serial(G):
                    for j in T.Parallel(N):
                        acc[j] += P[g, j]
                T.copy(acc, Y[0])
                T.atomic_add(Count[0], -G)
    return build_kernel(main, {"X": T.Tensor((G, N), T.float32), "P": T.Tensor((G, N), T.float32),
                               "Count": T.Tensor((1,), T.int32), "Order": T.Tensor((G,), T.int32),
                               "Y": T.Tensor((N,), T.float32)})


def misc(G=4):
    """Element-wise forms: a transposing (permuted) parallel load, a broadcast subset load, masked
    parallel stores, local scalars and arrays, a loop bound held at run time, an unrolled loop, a
    branch on the block index, element atomics, and Python floor division and modulo of negative
    integers."""
    @T.prim_func
    def main(X: T.Tensor((64, 32), T.float32), Y: T.Tensor((32, 64), T.float32),
             S: T.Tensor((G,), T.float32), Q: T.Tensor((G, 16), T.int32),
             H: T.Tensor((4,), T.float32)):
        with T.Kernel(G, threads=128) as bx:
            x = T.alloc_fragment((64, 32), T.float32)
            xt = T.alloc_shared((32, 64), T.float32)
            col = T.alloc_fragment((32,), T.float32)
            acc = T.alloc_local((1,), T.float32)
            hist = T.alloc_local((4,), T.float32)
            T.copy(X, x)
            for i, j in T.Parallel(32, 64):
                xt[i, j] = x[j, i] * (bx + 1)
            T.reduce_sum(xt, col, dim=1)
            for i, j in T.Parallel(32, 64):
                if j % 2 == 0:
                    xt[i, j] = xt[i, j] + col[i]
            acc[0] = 0.0
            for k in range(bx + 1):
                acc[0] = acc[0] + k
            for u in T.unroll(4):
                hist[u] = acc[0] * u
            if bx % 2 == 1:
                acc[0] = acc[0] + hist[3]
            for i in T.Parallel(1):
                S[bx + i] = acc[0]
            for i in T.Parallel(16):
                Q[bx, i] = (i - 8 - bx) // 3 * 100 + (i - 8 - bx) % 3
                T.atomic_add(H[i % 4], 0.5)
            if bx == 0:
                T.copy(xt, Y)
    return build_kernel(main)


def tail(M, N, bm=16, bn=64):
    """Y = the last bm x bn tile of a uint8 X, copied through shared memory, and Z = the tile above
    it, read element by element: with 2**31 elements or more in X its offsets need 64 bits."""
    @T.prim_func
    def main(X: T.Tensor((M, N), T.uint8), Y: T.Tensor((bm, bn), T.uint8),
             Z: T.Tensor((bm, bn), T.uint8)):
        with T.Kernel(1, threads=128) as bx:
            X_s = T.alloc_shared((bm, bn), T.uint8)
            T.copy(X[M - bm, N - bn], X_s)
            T.copy(X_s, Y)
            for i, j in T.Parallel(bm, bn):
                Z[i, j] = X[M - 2 * bm + i, N - bn + j]
    return build_kernel(main)


# ----------------------------------------------------------------------------------------------
# numeric cases: each builds its kernel; with a device it also runs and checks it


def _run(kernel, args, device):
    load(kernel, "tl", TRITON_CPU if device == "cpu" else TRITON_GPU).launch(args)


def _close(out, ref, atol, rtol):
    err = (out.double() - ref).abs()
    bad = ~(err <= atol + rtol * ref.abs())
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} elements off; max |err| {err.max():.3g}"
    return float(err.max())


# (atol, rtol). bfloat16 outputs round to nearest (half an ulp, 2^-8 relative; under Triton's CPU
# interpreter tilews rounds them itself). float32 operands on a GPU: tl.dot uses tf32.
_TOL = {"float16": (1e-2, 2e-3), "bfloat16": (5e-2, 1e-2), "float32": (1e-4, 1e-5)}
_TOL_GPU = {**_TOL, "bfloat16": (2e-2, 4e-3), "float32": (2e-2, 2e-3)}


def _gemm_case(dtype_name, M, N, K, transpose_b=False, swizzle=0, **blocks):
    def case(device=None):
        kernel = gemm(M, N, K, getattr(T, dtype_name), transpose_b=transpose_b, swizzle=swizzle,
                      **blocks)
        if device is None:
            return kernel
        import torch
        dt = getattr(torch, dtype_name)
        a = randn(M, K, dtype=dt, device=device, seed=1)
        b = randn(*((N, K) if transpose_b else (K, N)), dtype=dt, device=device, seed=2)
        big = poisoned(M + 8, N + 8, dtype=dt, device=device)
        c = big[:M, :N]  # a strided view: the kernel must use the strides and mask the edges
        _run(kernel, [a, b, c], device)
        ref = a.double() @ (b.double().T if transpose_b else b.double())
        tol = (_TOL if device == "cpu" else _TOL_GPU)[dtype_name]
        assert big[M:].isnan().all() and big[:, N:].isnan().all(), "stored outside C"
        return _close(c, ref, *tol)
    return case


def case_ws_gemm(device=None):
    M, N, K = 128, 128, 100
    kernel = build_kernel(ws_matmul_program(M, N, K, block_M=64, block_N=64))
    if device is None:
        return kernel
    import torch
    a = randn(M, K, dtype=torch.float16, device=device, seed=3)
    b = randn(K, N, dtype=torch.float16, device=device, seed=4)
    c = poisoned(M, N, dtype=torch.float16, device=device)
    _run(kernel, [a, b, c], device)
    return _close(c, a.double() @ b.double(), *_TOL["float16"])


def case_softmax(device=None):
    M, N = 50, 200
    kernel = softmax(M, N)
    if device is None:
        return kernel
    import torch
    x = randn(M, N, dtype=torch.float32, device=device, seed=5) * 4
    y = poisoned(M, N, device=device)
    _run(kernel, [x, y], device)
    return _close(y, torch.softmax(x.double(), dim=1), 1e-6, 1e-5)


def case_axpy_dynamic(device=None):
    kernel = axpy()
    if device is None:
        return kernel
    import torch
    errs = []
    for n in (1000, 77):  # one compiled kernel for both lengths (n is a runtime parameter)
        x, y = (randn(n, dtype=torch.float32, device=device, seed=s) for s in (6, 7))
        z = poisoned(n + 5, device=device)
        _run(kernel, [n, x, y, z[:n], 1.5], device)
        assert z[n:].isnan().all(), "stored past n"
        errs.append(_close(z[:n], 1.5 * x.double() + y.double(), 1e-6, 1e-6))
    return max(errs)


def case_split_k_atomic(device=None):
    M, N, K = 64, 96, 256
    kernel = split_k(M, N, K, splits=4)
    if device is None:
        return kernel
    import torch
    a = randn(M, K, dtype=torch.float16, device=device, seed=8)
    b = randn(K, N, dtype=torch.float16, device=device, seed=9)
    c = randn(M, N, dtype=torch.float32, device=device, seed=10)
    ref = c.double() + a.double() @ b.double()
    _run(kernel, [a, b, c], device)
    return _close(c, ref, 1e-3, 1e-5)


def case_last_block_sum(device=None):
    G, N = 24, 64
    kernel = last_block_sum(G, N)
    if device is None:
        return kernel
    import torch
    x = randn(G, N, device=device, seed=14)
    p, y = poisoned(G, N, device=device), poisoned(N, device=device)
    count = torch.zeros(1, dtype=torch.int32, device=device)
    order = torch.full((G,), -1, dtype=torch.int32, device=device)
    for _ in range(3):                  # the count is back at 0 after each launch
        _run(kernel, [x, p, count, order, y], device)
        assert int(count) == 0 and sorted(order.tolist()) == list(range(G)), (count, order)
    return _close(y, 2 * x.double().sum(0), 1e-5, 1e-6)


def case_group_rows(device=None):
    N, G = 100, 3
    kernel = group_rows(N, G)
    if device is None:
        return kernel
    import torch
    a = randn(N, 64, device=device, seed=15)
    offs = torch.tensor([0, 32, 64], dtype=torch.int32, device=device)
    c = poisoned(N, 64, device=device)
    _run(kernel, [a, offs, c], device)
    group = torch.arange(N, device=device) // 32
    return _close(c, (a + offs[group.clamp(max=G - 1)].float()[:, None]).double(), 0, 0)   # one f32 add


def case_varlen_writes(device=None):
    lens = (21, 5, 40)
    kernel = varlen_writes(lens)
    if device is None:
        return kernel
    import torch
    B, R, blocks = len(lens), sum(lens), 3
    x = randn(R, 16, device=device, seed=16)
    cu = torch.tensor([0, 21, 26, 66], dtype=torch.int32, device=device)
    y, s, f = poisoned(R, 16, device=device), poisoned(R, device=device), poisoned(B, blocks, device=device)
    tot = torch.zeros(B, device=device)
    _run(kernel, [x, cu, y, s, f, tot], device)
    rows = x.double().sum(1)
    want_f = torch.tensor(lens, dtype=torch.float64)[:, None] - 16 * torch.arange(blocks)
    want_tot = torch.stack([x.double()[a:a + n].sum() for a, n in zip((0, 21, 26), lens)])
    return max(_close(y, x.double() - rows[:, None], 1e-5, 1e-5), _close(s, rows, 1e-5, 1e-5),
               _close(f, want_f.to(f.device), 0, 0), _close(tot, want_tot.to(tot.device), 1e-4, 1e-5))


def case_misc(device=None):
    G = 4
    kernel = misc(G)
    if device is None:
        return kernel
    import torch
    x = randn(64, 32, device=device, seed=11)
    y, s = poisoned(32, 64, device=device), poisoned(G, device=device)
    q = torch.full((G, 16), -12345, dtype=torch.int32, device=device)
    h = randn(4, device=device, seed=12)
    h_ref = h.double() + 0.5 * 4 * G
    _run(kernel, [x, y, s, q, h], device)
    xt = x.double().T.clone()
    xt[:, ::2] += x.double().sum(0)[:, None]
    acc = torch.tensor([b * (b + 1) / 2 * (4 if b % 2 else 1) for b in range(G)], dtype=torch.float64)
    v = torch.arange(16)[None, :] - 8 - torch.arange(G)[:, None]
    assert torch.equal(q.cpu(), (torch.div(v, 3, rounding_mode="floor") * 100 + v % 3).int())
    return max(_close(y, xt, 1e-5, 1e-6), _close(s, acc.to(device), 0, 0), _close(h, h_ref, 1e-6, 0))


def case_huge_uint8_tail(device=None):
    M, N = 32832, 65536  # 2**31 + 2**22 bytes; the tiles start past 2**31
    kernel = tail(M, N)
    if device is None:
        return kernel
    import torch
    x = torch.empty(M, N, dtype=torch.uint8, device=device)  # only the last rows are written
    x[-32:] = torch.randint(0, 256, (32, N), generator=torch.Generator().manual_seed(13),
                            dtype=torch.uint8).to(device)
    y, z = (torch.zeros(16, 64, dtype=torch.uint8, device=device) for _ in range(2))
    _run(kernel, [x, y, z], device)
    assert torch.equal(y, x[-16:, -64:]) and torch.equal(z, x[-32:-16, -64:])
    return 0.0


CASES = {
    "gemm_f16_ragged": _gemm_case("float16", 100, 72, 88),
    "gemm_bf16_transpose_b": _gemm_case("bfloat16", 100, 72, 88, transpose_b=True),
    "gemm_f32_swizzled": _gemm_case("float32", 100, 136, 72, swizzle=2, bk=16),
    "ws_gemm_despecialized": case_ws_gemm,
    "softmax": case_softmax,
    "axpy_dynamic": case_axpy_dynamic,
    "split_k_atomic": case_split_k_atomic,
    "misc_elementwise": case_misc,
    "last_block_sum": case_last_block_sum,
    "huge_uint8_tail": case_huge_uint8_tail,
    "group_rows_scalar_load": case_group_rows,
    "varlen_writes_under_wider_ifs": case_varlen_writes,
}


# ----------------------------------------------------------------------------------------------
# pytest


def _subprocess(*args: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1" if args[0].startswith("run") else "0"}
    proc = subprocess.run([sys.executable, "-m", "tests.test_tl_backend", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout[-4000:]}{proc.stderr[-8000:]}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_numerics_interpreter(name):
    _subprocess("run", name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_for_gpu(name):
    _subprocess("compile", name)


def test_launch_checks_arguments():
    _subprocess("run-checks")


def test_interpreter_after_plain_import_is_refused():
    code = ("import triton\nfrom tilews.triton_ext.tl import ensure_interpreter\n"
            "try:\n    ensure_interpreter()\nexcept RuntimeError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    assert "set TRITON_INTERPRET=1 in the environment before" in proc.stdout, proc.stderr


def test_emitted_source():
    src = emit(lower(gemm(128, 128, 128, T.float16), TRITON_GPU))
    assert "tl.dot(A_s, B_s, acc=C_f, out_dtype=tl.float32)" in src
    assert "tl.range(0, 4, 1, num_stages=3)" in src
    assert f"# tilews: {Path(__file__).name}:{marked_line(gemm, 'T.gemm(A_s, B_s')}" in src
    assert "def main_grid():" in src


def test_emitted_interpreter_source():
    src = emit(lower(gemm(100, 72, 88, T.bfloat16), TRITON_CPU))
    assert "tl.dot(A_s.to(tl.float32), B_s.to(tl.float32)" in src
    assert "mask=" in src
    src = emit(lower(axpy(), TRITON_CPU))
    head = "def main(n: tl.constexpr, X, X_stride0, Y, Y_stride0, Z, Z_stride0, alpha: tl.constexpr):"
    assert head in src
    assert "def main_grid(n, alpha):" in src


def test_64_bit_offsets_only_where_needed():
    huge = emit(lower(tail(32832, 65536), TRITON_GPU))
    assert ("tl.cast(X_i0[:, None], tl.int64) * X_stride0 + "
            "tl.cast(X_i1[None, :], tl.int64) * X_stride1") in huge
    assert "tl.cast((32800 + i), tl.int64) * X_stride0" in huge    # the element read
    assert "Y_i0[:, None] * Y_stride0" in huge and "Z + i * Z_stride0" in huge   # small: 32 bits
    for small in (tail(64, 64), gemm(100, 72, 88, T.float16)):
        assert "int64" not in emit(lower(small, TRITON_GPU))
    src = emit(lower(axpy(), TRITON_GPU))    # a runtime dim may be anything
    assert "tl.cast(((bx * 128) + i), tl.int64) * X_stride0" in src


def test_extents_not_powers_of_two_are_padded():
    # a 48-wide tile is a tensor of 64 columns: loads and stores masked by the tile's extent
    src = emit(lower(gemm(128, 128, 128, T.float16, bn=48), TRITON_GPU))
    assert "B_s = tl.zeros((32, 64), tl.float16)" in src
    assert "(tl.arange(0, 64)[None, :] < 48)" in src.split("tl.load(B", 1)[1].split("\n", 1)[0]


# ----------------------------------------------------------------------------------------------
# the subprocess side


_PTR = {ir.DType.F16: "fp16", ir.DType.BF16: "bf16", ir.DType.F32: "fp32", ir.DType.F64: "fp64",
        ir.DType.I32: "i32", ir.DType.I64: "i64", ir.DType.I8: "i8", ir.DType.U8: "u8"}


def _compile_for_gpu(kernel: ir.Kernel):
    """Compile the emitted source for sm_90 without a GPU; returns Triton's compiled kernel."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tilews.lowering.plans import StreamPlan
    lowered = lower(kernel, TRITON_GPU)
    src = emit(lowered)
    spec = importlib.util.spec_from_file_location("tilews_compile_check",
                                                  services().store.source_file(src))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signature = {}
    for p in lowered.params:
        if isinstance(p, ir.Buffer):
            signature[p.name] = "*" + _PTR[p.dtype]
            signature.update({f"{p.name}_stride{d}": "i32" for d in range(len(p.shape))})
        else:
            signature[p.name] = _PTR[p.dtype]
    compiled = triton.compile(ASTSource(triton.jit(getattr(module, lowered.name)), signature, {}),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": lowered.plan(StreamPlan).num_warps})
    return compiled


def _launch_checks() -> None:
    import torch

    from tilews.triton_ext.tl import ensure_interpreter
    ensure_interpreter()
    prog = load(axpy(), "tl", TRITON_CPU)
    x = randn(10)
    for args, error, words in (([10, x, x], TypeError, "takes 5 argument(s)"),
                               ([10, x, x.double(), x, 1.0], TypeError,
                                "'Y' has dtype torch.float64, expected torch.float32"),
                               ([10, x, x[:5], x, 1.0], ValueError, "dimension 0 of 'Y' is 5, but 'n' is 10"),
                               ([10, x, x, x, "a"], TypeError, "'alpha' must be a number")):
        try:
            prog.launch(args)
        except error as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError(f"no {error.__name__} for {words}")
    z = torch.zeros(10)
    prog.launch([10, x, x, z, 2.0])
    assert torch.equal(z, 3 * x) and set(prog.asm) == {"tl"}


def main(argv: list[str]) -> None:
    mode, names = argv[0], argv[1:] or sorted(CASES)
    if mode == "run":
        from tilews.triton_ext.tl import ensure_interpreter
        ensure_interpreter()
        for n in names:
            CASES[n]("cpu")
    elif mode == "run-checks":
        _launch_checks()
    elif mode == "compile":
        for n in names:
            ptx = _compile_for_gpu(CASES[n]()).asm["ptx"]
            assert ".entry main" in ptx
            if "gemm" in n or "split_k" in n:
                assert "mma" in ptx, f"{n}: no tensor-core instruction in the PTX"
            if n == "last_block_sum":       # the count: acq_rel at device scope, after a bar.sync
                before, add, after = ptx.partition("atom.global.gpu.acq_rel.add")
                assert add and "bar.sync" in before.rsplit(".entry", 1)[-1], ptx[-3000:]
                assert "atom.global.gpu.relaxed.add" in after, "the reset is a relaxed add"
    elif mode == "gpu":
        import torch
        print(f"{'case':28} {'max |err|':>10} {'first (s)':>10} {'again (s)':>10}")
        for n in names:
            t0 = time.perf_counter()
            err = CASES[n]("cuda")
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            CASES[n]("cuda")
            torch.cuda.synchronize()
            print(f"{n:28} {err:10.3g} {t1 - t0:10.3f} {time.perf_counter() - t1:10.3f}")
    else:
        raise SystemExit("usage: python -m tests.test_tl_backend run|run-checks|compile|gpu [case ...]")


if __name__ == "__main__":
    main(sys.argv[1:])
