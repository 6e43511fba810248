"""Memory safety: tiles and elements that start before a tensor, end past it or straddle an edge.

Every tensor a kernel gets is a view into the middle of a larger buffer whose guard cells hold a
sentinel; after the run the guards must be untouched, and the views must equal what the reference
interpreter (``target="interpret"``: zero-filled loads, masked stores) computes. On the ``triton``
target (Triton's CPU interpreter without a GPU: ``tests/conftest.py`` selects it) unmasked
accesses would read the guards (wrong values) or write them. Offsets are random (hypothesis): a
row offset that is a build-time constant (legalize's interval analysis decides exactly which
bounds to check) and a column offset that is a runtime scalar (every bound checked). The Hopper
path is compile-only here: TMA boxes are clipped by the hardware, element reads are masked.
"""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilews
import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import legalize_wgmma
from tilews.lowering.pipeline import lower
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import transform
from tilews.triton_ext.gluon import emit as gluon_emit

from .helpers import randn
from .test_ws_oracle import block_sparse_gemm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GUARD = 128         # guard cells on every side: more than any offset below reaches
SENTINEL = 7777.0   # in the guards of every buffer (an input's guards read as wrong values)


def shifted(M, N, bm, bn, dr):
    """Through shared memory, B's tile at (-dr, -dc) = A's tile at (+dr, +dc) and E's tile at
    (-dr, +dc) += it; element by element, C[r - dr, c + dc] = A[r + dr, c - dc] + 1 and
    D[r + dr, c + dc] += A[r, c]."""
    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), B: T.Tensor((M, N), T.float32),
             C: T.Tensor((M, N), T.float32), D: T.Tensor((M, N), T.float32),
             E: T.Tensor((M, N), T.float32), dc: T.int32):
        with T.Kernel(T.ceildiv(M, bm), T.ceildiv(N, bn), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bn), T.float32)
            T.copy(A[bx * bm + dr, by * bn + dc], A_s)
            T.copy(A_s, B[bx * bm - dr, by * bn - dc])
            T.atomic_add(E[bx * bm - dr, by * bn + dc], A_s)
            for i, j in T.Parallel(bm, bn):
                C[bx * bm + i - dr, by * bn + j + dc] = A[bx * bm + i + dr, by * bn + j - dc] + 1.0
                T.atomic_add(D[bx * bm + i + dr, by * bn + j + dc], A[bx * bm + i, by * bn + j])
    return main


def guarded(inner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A buffer of SENTINEL with ``inner`` copied into its middle, and the view of the middle."""
    M, N = inner.shape
    big = torch.full((M + 2 * GUARD, N + 2 * GUARD), SENTINEL, device=DEVICE)
    view = big[GUARD:GUARD + M, GUARD:GUARD + N]
    view.copy_(inner)
    return big, view


def check_shifted(M, N, bm, bn, dr, dc, seed=0):
    a = randn(M, N, seed=seed)
    inits = [a, torch.full((M, N), -1.0), torch.full((M, N), -2.0), torch.zeros(M, N),
             torch.zeros(M, N)]
    ref = [x.clone() for x in inits]
    tilews.jit(target="interpret")(shifted)(M, N, bm, bn, dr)(*ref, dc)
    bigs, views = zip(*(guarded(x) for x in inits))
    tilews.jit(target="triton")(shifted)(M, N, bm, bn, dr)(*views, dc)
    for name, big, view, want in zip("ABCDE", bigs, views, ref):
        guard = torch.ones_like(big, dtype=torch.bool)
        guard[GUARD:GUARD + M, GUARD:GUARD + N] = False
        assert (big[guard] == SENTINEL).all(), f"{name}: written outside the tensor"
        assert torch.equal(view.cpu(), want), f"{name}: differs from the interpreter"


def test_halo_tiles_before_and_after_the_tensor():
    check_shifted(40, 24, 16, 8, dr=-4, dc=3)    # reads in front of A, writes rows past B's end
    check_shifted(40, 24, 16, 8, dr=4, dc=-3)    # writes rows in front of B, columns before C's


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(1, 40), N=st.integers(1, 40), bm=st.sampled_from([8, 16]),
       bn=st.sampled_from([8, 16]), dr=st.integers(-48, 48), dc=st.integers(-48, 48),
       seed=st.integers(0, 2**16))
def test_random_offsets_touch_only_the_tensor(M, N, bm, bn, dr, dc, seed):
    check_shifted(M, N, bm, bn, dr, dc, seed)


# ----------------------------------------------------------------------------------------------
# Hopper (compile-only): what the Gluon emitter does with accesses that may start before a tensor


def test_hopper_element_reads_check_the_lower_bound():
    """A TMA box is clipped by the hardware (negative coordinates read zeros, stores there are
    dropped), so its coordinates are passed as they are; an element read (the block mask) checks
    ``>= 0`` where its index may be negative, and only there."""
    base = lower(build_kernel(block_sparse_gemm(128, 64, 192)), HOPPER, upto="legalize")
    by = next(v for v in base.block_vars if v.name == "by")
    back = ir.BinOp(ir.BinOpKind.SUB, by, ir.const(1), ir.DType.I32)
    shifted_mask = transform(base, lambda n: dataclasses.replace(n, indices=(back, n.indices[1]))
                             if isinstance(n, ir.Load) and n.buffer.name == "BlockMask" else None)
    for kernel, check in ((base, False), (shifted_mask, True)):
        src = gluon_emit(legalize_wgmma.run(kernel, HOPPER))
        loads = [line for line in src.splitlines() if "gl.load(BlockMask" in line]
        assert loads and all(("(by - 1) >= 0" in line) == check for line in loads), loads
        assert all(">= 0" not in line for line in src.splitlines() if "tma.async_copy" in line)
