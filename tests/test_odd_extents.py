"""Tile extents that are not powers of two (issue 38, item 1) on the ``tl`` backend and Metal.

Triton's register tensors take power-of-two shapes: legalize records in the ``StreamPlan`` that
every on-chip buffer and ``T.Parallel`` loop of extent n is a tensor of the next power of two, and
the ``tl`` emitter keeps the padding zero (masked loads, stores and assignments; reductions over a
padded dim see their neutral element there). Metal runs the natural extents. Each program runs on
``interpret``, ``triton`` (Triton's CPU interpreter) and ``metal`` (the CPU harness) against a
float64 torch reference, outputs poisoned; on ``hopper`` it compiles through the ``tl`` fallback.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilews
import tilews.language as T
from tilews.ops.attention import mha_fwd_program

from .helpers import randn

TARGETS = ["interpret", "triton", "metal"]
ROOT = Path(__file__).resolve().parents[1]


def build(program, target):
    return tilews.jit(out_idx=-1, target=target)(program)


def gemm(M, N, K, bm, bn, bk, dtype=T.float16):
    """C = A @ B with a bm x bn x bk tile, TileLang style."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * bm, bx * bn])
    return main


def softmax_rows(M, N, bm):
    """Row softmax of an [M, N] matrix, a whole row (N columns, any N) per tile row."""
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, bm), threads=128) as bx:
            x = T.alloc_fragment((bm, N), T.float32)
            mx = T.alloc_fragment((bm,), T.float32)
            mn = T.alloc_fragment((bm,), T.float32)
            total = T.alloc_fragment((bm,), T.float32)
            T.copy(X[bx * bm, 0], x)
            T.reduce_max(x, mx, dim=1)
            T.reduce_min(x, mn, dim=1)
            for i, j in T.Parallel(bm, N):
                x[i, j] = T.exp(x[i, j] - mx[i])
            T.reduce_sum(x, total, dim=1)
            for i, j in T.Parallel(bm, N):
                x[i, j] = x[i, j] / total[i] + mn[i] * 0.0
            T.copy(x, Y[bx * bm, 0])
    return main


def row_scan(M, N):
    """Cumulative sums along rows of odd width, and a column of row maxima of odd length."""
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_shared((M, N), T.float32)
            y = T.alloc_fragment((M, N), T.float32)
            T.copy(X[0, 0], x)
            T.copy(x, y)
            T.cumsum(y, dim=1)
            T.copy(y, Y[0, 0])
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bn,bk", [(192, 48), (96, 96)])
def test_gemm_with_odd_tiles(target, bn, bk):
    M, N, K = 64, 2 * bn + 40, 3 * bk + 8          # ragged edges as well as odd tiles
    a, b = randn(M, K, dtype=torch.float16, seed=1), randn(K, N, dtype=torch.float16, seed=2)
    c = build(gemm(M, N, K, 32, bn, bk), target)(a, b)
    ref = a.double() @ b.double()
    assert torch.allclose(c.double(), ref, atol=1e-2, rtol=1e-3), (c.double() - ref).abs().max()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("N", [192, 100, 3])
def test_softmax_rows_over_odd_columns(target, N):
    M = 40
    x = randn(M, N, seed=3) * 3 - 2                 # all-negative rows would hide a zero pad
    y = build(softmax_rows(M, N, 16), target)(x)
    assert torch.allclose(y.double(), torch.softmax(x.double(), dim=1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_cumsum_along_an_odd_dim(target):
    x = randn(5, 6, seed=4)
    y = build(row_scan(5, 6), target)(x)
    assert torch.allclose(y.double(), x.double().cumsum(1), atol=1e-5)


def attention_ref(q, k, v):
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v.double()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dim", [192, 96])
def test_attention_forward_at_odd_head_dims(target, dim):
    B, H, S = 1, 2, 80
    q, k, v = (randn(B, H, S, dim, dtype=torch.float16, seed=s) for s in (5, 6, 7))
    prog = mha_fwd_program(B, H, S, dim, False, block_M=16, block_N=16, num_stages=1, threads=128)
    o = build(prog, target)(q, k, v)
    assert torch.allclose(o.double(), attention_ref(q, k, v), atol=2e-3, rtol=1e-2)


HOPPER_CASES = {
    "gemm_192x48": lambda: gemm(256, 384, 192, 64, 192, 48),
    "softmax_192": lambda: softmax_rows(256, 192, 16),
}
# (attention at D=192 stays on the Gluon path: split_extents cuts it into 128 + 64 pieces,
# tests/test_gluon_odd_extents.py)


@pytest.mark.parametrize("name", sorted(HOPPER_CASES))
def test_hopper_falls_to_tl_and_compiles(name):
    """Where the Gluon path refuses an odd tile, ``hopper`` runs the ``tl`` form (its tensors
    padded to 256), which Triton compiles for sm_90 (without a GPU, in a child process)."""
    k = build(HOPPER_CASES[name](), "hopper")
    assert k.report.target == "hopper -> triton" and k.report.backend == "tl", k.report.notes
    assert "tl.arange(0, 256)" in k.get_kernel_source()
    compile_for_sm90(__name__, "HOPPER_CASES", name)


def compile_for_sm90(module: str, table: str, name: str) -> None:
    """Compile ``module.table[name]()``'s ``tl`` form for sm_90 in a child process (Triton's CPU
    interpreter, chosen in this one, cannot)."""
    code = (f"from tilews.lowering.frontend import build_kernel\n"
            f"from tests.test_tl_backend import _compile_for_gpu\n"
            f"from {module} import {table}\n"
            f"assert '.entry main' in _compile_for_gpu(build_kernel({table}[{name!r}]())).asm['ptx']")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert proc.returncode == 0, proc.stderr[-6000:]
