"""The thread level on target="metal": per-thread code (``T.get_thread_binding``) spelled SIMT.

Each kernel is emitted by the Metal backend and run through the CPU harness (the MSL compiled as
C++, one lane per Metal thread) against float64, outputs poisoned with NaN before the launch.
Then: where legalize_metal keeps the per-thread locals (each thread's own part in registers, or
threadgroup memory where another thread reads them), threadgroup atomics (float32 by
compare-and-swap, int32 natively; float16 refused at the user's line), and the barrier between
the shared atomics and their read (planted out, ThreadSanitizer reports the race).
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews import CompileError
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import FragmentStoragePlan
from tilews.metal import harness
from tilews.metal.backend import METAL
from tilews.metal.emit import emit

from ..helpers import marked_line, poisoned, randn, rel_err
from ..thread_programs import naive_gemv, splitk_gemv

pytestmark = pytest.mark.skipif(harness.compiler() is None, reason="needs a C++17 compiler")


def metal(prog):
    return tilews.compile(prog, target="metal")


def storage(kernel) -> dict:
    return dict(kernel.ir_after.plan(FragmentStoragePlan).storage)


# ----------------------------------------------------------------------------------------------
# programs, as TileLang users write them (gemv/example_gemv.py)


def ragged_rows(N, L, BLOCK):
    """Y[r] = 2 * (sum of the positive X[r, :lens[r]]): a loop whose bounds differ per thread, a
    per-thread branch, and a shared exchange at a thread-computed index."""
    @T.prim_func
    def main(X: T.Tensor((N, L), "float32"), lens: T.Tensor((N,), "int32"),
             Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as bx:
            t = T.get_thread_binding(0)
            S = T.alloc_shared((BLOCK,), "float32")
            acc = T.alloc_local((1,), "float32")
            acc[0] = 0
            for k in T.serial(lens[bx * BLOCK + t]):
                if X[bx * BLOCK + t, k] > 0:
                    acc[0] += X[bx * BLOCK + t, k]
            S[(t * 5) % BLOCK] = acc[0]
            T.sync_threads()
            Y[bx * BLOCK + t] = S[(t * 5) % BLOCK] * 2
    return main


def neighbours(N, BLOCK):
    """Y[i] = X[i] * X[i+1 within the block]: a fragment each thread writes at its own index and
    reads at its neighbour's, beside a per-thread local."""
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as bx:
            t = T.get_thread_binding(0)
            F = T.alloc_fragment((BLOCK,), "float32")
            mine = T.alloc_local((1,), "float32")
            F[t] = X[bx * BLOCK + t]
            mine[0] = F[t] * 3
            T.sync_threads()
            Y[bx * BLOCK + t] = mine[0] * F[(t + 1) % BLOCK] / 3
    return main


def histogram(N, BINS, BLOCK):
    """Per-block int32 counts of X % BINS, atomically in shared memory."""
    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), H: T.Tensor((T.ceildiv(N, BLOCK), BINS), "int32")):
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as bx:
            t = T.get_thread_binding(0)
            counts = T.alloc_shared((BINS,), "int32")
            if t < BINS:
                counts[t] = 0
            T.sync_threads()
            T.atomic_add(counts[X[bx * BLOCK + t] % BINS], 1)
            T.sync_threads()
            if t < BINS:
                H[bx, t] = counts[t]
    return main


def shared_half_atomic():
    @T.prim_func
    def main(A: T.Tensor((64,), "float16"), B: T.Tensor((4,), "float16")):
        with T.Kernel(1, threads=64) as bx:
            t = T.get_thread_binding(0)
            S = T.alloc_shared((4,), "float16")
            if t < 4:
                S[t] = 0
            T.atomic_add(S[t % 4], A[t])  # <- error
            B[t % 4] = S[t % 4]
    return main


# ----------------------------------------------------------------------------------------------
# numerics


def gemv_operands(N, K, seed):
    A, B = randn(K, dtype=torch.float16, seed=seed), randn(N, K, dtype=torch.float16, seed=seed + 1)
    return A, B, B.double() @ A.double()


@pytest.mark.parametrize("N,K", [(256, 512), (10, 300)], ids=["even", "ragged"])
def test_split_k_gemv(N, K):
    """threads=(4, 32): each thread loads 8 elements of its K slice into registers, folds them,
    and adds its partial into the block's shared C with a threadgroup atomic."""
    k = metal(splitk_gemv(N, K, BLOCK_N=4, reduce_threads=32))
    assert storage(k) == {"A_local": "private", "B_local": "private", "C_accum": "private"}
    src = k.get_kernel_source()
    assert re.search(r"^\s*half A_local\[8\];", src, re.M) and "threadgroup float C_shared[4];" in src
    assert "tws_atomic_add_threadgroup(C_shared + (tn_" in src
    A, B, ref = gemv_operands(N, K, seed=1)
    C = poisoned(N, dtype=torch.float16)
    k(A, B, C)
    assert C.isfinite().all()
    assert rel_err(C, ref) < 2e-3


def test_naive_gemv():
    """threads=128, one row per thread: the accumulator stays in each thread's registers (a
    thread-private float, not threadgroup memory)."""
    N, K = 200, 96
    k = metal(naive_gemv(N, K, BLOCK_N=128, BLOCK_K=32))
    assert storage(k) == {"C_reg": "private"}
    A, B, ref = gemv_operands(N, K, seed=3)
    C = poisoned(N, dtype=torch.float16)
    k(A, B, C)
    assert C.isfinite().all()
    assert rel_err(C, ref) < 2e-3
    src = k.get_kernel_source()
    assert re.search(r"^\s*float C_reg\[1\];", src, re.M) and "threadgroup float C_reg" not in src


def test_ragged_per_thread_loop_with_branch_and_shared_exchange():
    N, L, BLOCK = 100, 40, 64
    k = metal(ragged_rows(N, L, BLOCK))
    assert storage(k)["acc"] == "private"
    X = randn(N, L, seed=5)
    lens = torch.randint(0, L + 1, (N,), generator=torch.Generator().manual_seed(6), dtype=torch.int32)
    lens[:3] = torch.tensor([0, L, 1], dtype=torch.int32)
    Y = poisoned(N)
    k(X, lens, Y)
    Xd = X.double()
    mask = (torch.arange(L)[None, :] < lens[:, None].long()) & (Xd > 0)
    ref = 2 * (Xd * mask).sum(1)
    torch.testing.assert_close(Y.double(), ref, rtol=1e-5, atol=1e-5)


def test_local_read_by_another_thread_stays_in_threadgroup_memory():
    N, BLOCK = 96, 32
    k = metal(neighbours(N, BLOCK))
    assert storage(k) == {"F": "shared", "mine": "private"}
    X, Y = randn(N, seed=7), poisoned(N)
    k(X, Y)
    Xd = X.double().view(-1, BLOCK)
    ref = (Xd * Xd.roll(-1, dims=1)).flatten()
    torch.testing.assert_close(Y.double(), ref, rtol=1e-5, atol=1e-5)


def test_int32_atomics_into_threadgroup_memory():
    N, BINS, BLOCK = 256, 8, 64
    k = metal(histogram(N, BINS, BLOCK))
    assert "atomic_fetch_add_explicit((threadgroup atomic_int*)(counts + " in k.get_kernel_source()
    X = torch.randint(-1000, 1000, (N,), generator=torch.Generator().manual_seed(8), dtype=torch.int32)
    H = torch.full((N // BLOCK, BINS), -7, dtype=torch.int32)
    k(X, H)
    ref = torch.stack([torch.bincount(row.remainder(BINS).long(), minlength=BINS)
                       for row in X.view(-1, BLOCK)]).int()
    assert torch.equal(H, ref)


def test_float16_atomic_into_threadgroup_memory_is_refused_at_the_users_line():
    with pytest.raises(CompileError) as info:
        metal(shared_half_atomic())
    e = info.value
    assert type(e) is CompileError, repr(e)
    assert e.message == ("T.atomic_add into 'S' (shared, float16): Metal adds atomically to "
                         "float32, int32 and uint32 in threadgroup (shared) memory")
    assert e.loc.file == __file__ and e.loc.line == marked_line(shared_half_atomic), str(e)


# ----------------------------------------------------------------------------------------------
# the barrier between the shared atomics and their read, under ThreadSanitizer


def without_sync_after_atomics(kernel: ir.Kernel) -> ir.Kernel:
    """The kernel with the BlockSync after the per-thread atomic adds into shared memory removed."""
    stmts = list(kernel.body.stmts)
    at = next(i for i, s in enumerate(stmts) if isinstance(s, ir.Parallel)
              and any(isinstance(t, ir.AtomicAdd) for t in s.body.stmts))
    assert isinstance(stmts[at + 1], ir.BlockSync)
    del stmts[at + 1]
    return dataclasses.replace(kernel, body=dataclasses.replace(kernel.body, stmts=tuple(stmts)))


def sanitized(kernel: ir.Kernel) -> harness.HarnessKernel:
    try:
        return harness.build(emit(kernel), sanitizer="thread")
    except harness.HarnessUnavailable as error:
        pytest.skip(str(error))


def test_missing_barrier_after_shared_atomics_is_a_data_race():
    """The harness's lanes are OS threads that meet at a mutex in every barrier: in a threadgroup
    whose lanes happen to run one after another, those meetings order the racing accesses too, so
    the planted kernel runs 16 threadgroups, each one more chance for its lanes to overlap."""
    N, K = 64, 256
    lowered = lower(build_kernel(splitk_gemv(N, K, BLOCK_N=4, reduce_threads=32, one_writer=True)),
                    METAL)
    A, B, ref = gemv_operands(N, K, seed=9)
    C = poisoned(N, dtype=torch.float16)
    sanitized(lowered).run([A, B, C], (N // 4, 1, 1))          # clean, and right
    assert rel_err(C, ref) < 2e-3
    broken = sanitized(without_sync_after_atomics(lowered))
    with pytest.raises(harness.HarnessError, match="(?s)ThreadSanitizer: data race.*tws_atomic_add_threadgroup"):
        broken.run([A, B, poisoned(N, dtype=torch.float16)], (N // 4, 1, 1))
