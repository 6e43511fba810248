"""Communication across threads (issue 39), in TileLang's spellings: TVM's thread allreduce
(``T.attr`` / ``T.comm_reducer`` / ``T.tvm_thread_allreduce``), ``T.alloc_reducer`` /
``T.finalize_reducer``, warp shuffles and warp reductions, ``T.dp4a``. Each lowers in the
frontend to per-thread stores and loads and block-wide reductions; the programs run on
``target="interpret"`` and ``"triton"`` (Triton's CPU interpreter) against float64 references
or exact values, and the errors name the user's line.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.tvm import DataType

from .helpers import marked_line, randn

TARGETS = ["interpret", "triton", "metal"]
# ----------------------------------------------------------------------------------------------
# the programs of gemv/example_gemv.py, as TileLang users write them


def splitk_gemv_vectorized_tvm(A, B, BLOCK_N: int, reduce_threads: int,
                               dtype: T.dtype = T.float16, accum_dtype: T.dtype = T.float):
    N, K = T.const("N, K")
    MAX_TRANSACTION_SIZE_IN_BITS = 128
    TILE_K = MAX_TRANSACTION_SIZE_IN_BITS // DataType(dtype).bits
    BLOCK_K = reduce_threads * TILE_K

    A: T.Tensor((K,), dtype)
    B: T.Tensor((N, K), dtype)
    C = T.empty((N,), dtype)

    with T.Kernel(T.ceildiv(N, BLOCK_N), threads=(BLOCK_N, reduce_threads)) as bn:
        tn = T.get_thread_binding(0)
        tk = T.get_thread_binding(1)
        A_local = T.alloc_local((TILE_K,), dtype)
        B_local = T.alloc_local((TILE_K,), dtype)
        C_accum = T.alloc_local((1,), accum_dtype)

        T.clear(C_accum)
        for bk in T.serial(T.ceildiv(K, BLOCK_K)):
            for k in T.vectorized(TILE_K):
                A_local[k] = A[bk * BLOCK_K + tk * TILE_K + k]
                B_local[k] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk * TILE_K + k]
            for k in T.serial(TILE_K):
                C_accum[0] += A_local[k].astype(accum_dtype) * B_local[k].astype(accum_dtype)
        C_reduced = T.alloc_local((1,), accum_dtype)
        with T.attr(
            T.comm_reducer(lambda x, y: x + y, [T.cast(0, accum_dtype)]),
            "reduce_scope",
            T.reinterpret(T.uint64(0), dtype="handle"),
        ):
            T.evaluate(
                T.tvm_thread_allreduce(
                    T.uint32(1),
                    C_accum[0],
                    True,
                    C_reduced[0],
                    tk,
                    dtype="handle",
                )
            )

        C[bn * BLOCK_N + tn] = C_reduced[0]

    return C


def gemv_alloc_reducer(a, x, block_M=128, block_N=128, num_stages=2, threads=256,
                       dtype: T.dtype = T.float16, accum_dtype: T.dtype = T.float):
    M, N = T.const("M, N")
    a: T.Tensor((M, N), dtype)
    x: T.Tensor((N,), dtype)
    o = T.empty((M,), dtype)

    with T.Kernel(T.ceildiv(M, block_M), threads=threads) as i0_m:
        o_reducer = T.alloc_reducer(block_M, accum_dtype, replication="all")
        T.clear(o_reducer)
        for i0_n in T.Pipelined(T.ceildiv(N, block_N), num_stages=num_stages):
            a_smem = T.alloc_shared((block_M, block_N), dtype)
            T.copy(a[i0_m * block_M, i0_n * block_N], a_smem)
            a_frag = T.alloc_fragment((block_M, block_N), dtype)
            T.copy(a_smem, a_frag)
            x_frag = T.alloc_fragment(block_N, dtype)
            T.copy(x[i0_n * block_N], x_frag)
            for i1_m, i1_n in T.Parallel(block_M, block_N):
                o_reducer[i1_m] += a_frag[i1_m, i1_n] * x_frag[i1_n]
        T.finalize_reducer(o_reducer)
        T.copy(o_reducer, o[i0_m * block_M])

    return o


@pytest.mark.parametrize("target", TARGETS)
def test_splitk_gemv_with_tvm_thread_allreduce(target):
    N, K = 64, 512                       # 2 x 32 threads; 2 rounds of 256 columns per row
    A, B = randn(K, dtype=torch.float16, seed=1), randn(N, K, dtype=torch.float16, seed=2)
    C = tilews.jit(target=target)(splitk_gemv_vectorized_tvm)(A, B, 2, 32)
    torch.testing.assert_close(C.double(), B.double() @ A.double(), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_gemv_alloc_reducer(target, op):
    M, N = 96, 160                        # a partial last row tile and column tile
    a, x = randn(M, N, dtype=torch.float16, seed=3), randn(N, dtype=torch.float16, seed=4)
    if op == "sum":
        fn = tilews.jit(target=target)(gemv_alloc_reducer)
        ref = a.double() @ x.double()
    else:
        fn = tilews.jit(target=target)(gemv_max_reducer)
        ref = (a.double() * x.double()).amax(dim=1)
    out = fn(a, x, block_M=64, block_N=64, threads=128)
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=2e-2)


def gemv_max_reducer(a, x, block_M=64, block_N=64, threads=128, dtype: T.dtype = T.float16):
    """The largest product of each row, through a max reducer updated under a mask."""
    M, N = T.const("M, N")
    a: T.Tensor((M, N), dtype)
    x: T.Tensor((N,), dtype)
    o = T.empty((M,), dtype)
    with T.Kernel(T.ceildiv(M, block_M), threads=threads) as bm:
        r = T.alloc_reducer((block_M,), T.float32, op="max", replication="none")
        T.fill(r, -T.infinity(T.float32))
        for bn in T.serial(T.ceildiv(N, block_N)):
            a_frag = T.alloc_fragment((block_M, block_N), dtype)
            T.copy(a[bm * block_M, bn * block_N], a_frag)
            for i, j in T.Parallel(block_M, block_N):
                if bn * block_N + j < N:
                    r[i] = T.max(r[i], a_frag[i, j] * x[bn * block_N + j])
        T.finalize_reducer(r)
        T.copy(r, o[bm * block_M])
    return o


# ----------------------------------------------------------------------------------------------
# allreduce over several thread dims, with max


def max_allreduce(X, Y, dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((Y, X), dtype), Row: T.Tensor((Y, X), dtype), All: T.Tensor((Y, X), dtype)):
        with T.Kernel(1, threads=(X, Y)) as bx:
            tx, ty = T.get_thread_bindings()
            v = T.alloc_local((1,), dtype)
            row = T.alloc_local((1,), dtype)
            every = T.alloc_local((1,), dtype)
            v[0] = A[ty, tx]
            with T.attr(T.comm_reducer(lambda x, y: T.max(x, y), [-T.infinity(dtype)]),
                        "reduce_scope", T.reinterpret(T.uint64(0), dtype="handle")):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), v[0], True, row[0], tx,
                                                  dtype="handle"))
            with T.attr(T.comm_reducer(lambda x, y: T.max(x, y), [-T.infinity(dtype)]),
                        "reduce_scope", T.reinterpret(T.uint64(0), dtype="handle")):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), v[0], tx > 0, every[0], tx, ty,
                                                  dtype="handle"))
            Row[ty, tx] = row[0]
            All[ty, tx] = every[0]
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_max_allreduce_over_one_and_two_thread_dims(target):
    X, Y = 16, 4
    a = randn(Y, X, seed=5)
    row, every = tilews.jit(target=target, out_idx=[1, 2])(max_allreduce)(X, Y)(a)
    assert torch.equal(row, a.amax(dim=1, keepdim=True).expand(Y, X))
    # the condition leaves column 0 out of the second reduction
    assert torch.equal(every, a[:, 1:].max().expand(Y, X))


# ----------------------------------------------------------------------------------------------
# shuffles and warp reductions


def shuffles(n=64):
    @T.prim_func
    def main(A: T.Tensor((n,), T.int32), Butterfly: T.Tensor((n,), T.int32),
             Tree: T.Tensor((n,), T.int32), Up: T.Tensor((n,), T.int32),
             Bcast: T.Tensor((n,), T.int32), Warp: T.Tensor((n,), T.int32)):
        with T.Kernel(1, threads=n) as bx:
            tx = T.get_thread_binding(0)
            s = T.alloc_local((1,), T.int32)
            t = T.alloc_local((1,), T.int32)
            s[0] = A[tx]
            t[0] = A[tx]
            for offset in [16, 8, 4, 2, 1]:
                s[0] = s[0] + T.shfl_xor(s[0], offset)
                t[0] = t[0] + T.shfl_down(t[0], offset)
            Butterfly[tx] = s[0]
            Tree[tx] = t[0]
            Up[tx] = T.shfl_up(A[tx], 3, width=8)
            Bcast[tx] = T.shfl_sync(A[tx], 5, width=16)
            Warp[tx] = T.warp_reduce_max(A[tx])
    return main


def _tree(a):
    """shfl_down's sum tree as CUDA runs it: past the warp's end a lane reads its own value."""
    t = a.clone()
    for offset in [16, 8, 4, 2, 1]:
        lane = torch.arange(64) % 32
        src = torch.where(lane + offset < 32, torch.arange(64) + offset, torch.arange(64))
        t = t + t[src]
    return t


@pytest.mark.parametrize("target", TARGETS)
def test_shuffles_and_warp_reduction(target):
    a = torch.randint(-1000, 1000, (64,), dtype=torch.int32, generator=torch.Generator().manual_seed(6))
    outs = tilews.jit(target=target, out_idx=[1, 2, 3, 4, 5])(shuffles)()(a)
    butterfly, tree, up, bcast, warp = outs
    warps = a.view(2, 32)
    assert torch.equal(butterfly, warps.sum(dim=1).repeat_interleave(32))
    assert torch.equal(tree, _tree(a))
    assert torch.equal(tree.view(2, 32)[:, 0], warps.sum(dim=1))       # lane 0 holds the sum
    lane8 = torch.arange(64) % 8
    assert torch.equal(up, torch.where(lane8 >= 3, a[torch.arange(64) - 3], a))
    assert torch.equal(bcast, a.view(4, 16)[:, 5].repeat_interleave(16))
    assert torch.equal(warp, warps.amax(dim=1).repeat_interleave(32))


def warp_sum_2d(X, Y):
    """Warps across a 2-d block: threads (x, y) numbered x + X * y."""
    @T.prim_func
    def main(A: T.Tensor((Y, X), T.float32), S: T.Tensor((Y, X), T.float32)):
        with T.Kernel(1, threads=(X, Y)) as bx:
            tx = T.get_thread_binding(0)
            ty = T.get_thread_binding(1)
            S[ty, tx] = T.warp_reduce_sum(A[ty, tx])
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_warp_reduce_sum_counts_lanes_by_linear_thread_index(target):
    X, Y = 8, 8                      # a warp is 4 rows of 8
    a = randn(Y, X, seed=7)
    s = tilews.jit(target=target, out_idx=[1])(warp_sum_2d)(X, Y)(a)
    ref = a.double().view(2, 32).sum(dim=1).repeat_interleave(32).view(Y, X)
    torch.testing.assert_close(s.double(), ref, rtol=1e-5, atol=1e-5)


def dp4a_dot(n=32, K=64):
    @T.prim_func
    def main(A: T.Tensor((n, K), T.int8), B: T.Tensor((K,), T.int8), C: T.Tensor((n,), T.int32)):
        with T.Kernel(1, threads=n) as bx:
            tx = T.get_thread_binding(0)
            a_local = T.alloc_local((K,), T.int8)
            b_local = T.alloc_local((K,), T.int8)
            acc = T.alloc_local((1,), T.int32)
            for k in T.vectorized(K):
                a_local[k] = A[tx, k]
                b_local[k] = B[k]
            T.clear(acc)
            for ki in T.serial(K // 4):
                T.dp4a(a_local[ki * 4], b_local[ki * 4], acc[0])
            C[tx] = acc[0]
    return main


@pytest.mark.parametrize("target", TARGETS)
def test_dp4a(target):
    g = torch.Generator().manual_seed(8)
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (64,), dtype=torch.int8, generator=g)
    c = tilews.jit(target=target, out_idx=[2])(dp4a_dot)()(a, b)
    assert torch.equal(c, (a.int() @ b.int()))


# ----------------------------------------------------------------------------------------------
# errors at the user's line


def _error_at(fn, fragment, *args, marker="# <- error"):
    with pytest.raises(tilews.CompileError) as info:
        tilews.jit(target="interpret")(fn)(*args)
    e = info.value
    assert fragment in e.message, e.message
    assert e.loc is not None and e.loc.line == marked_line(fn, marker), str(e)
    assert "lowering/" not in e.message


def sum_allreduce_of(combiner, over_y):
    """A thread allreduce with ``combiner``, over tx (or over ty, which a 1-d kernel lacks)."""
    n = 64

    @T.prim_func
    def main(A: T.Tensor((n,), T.float32), B: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=n) as bx:
            tx = T.get_thread_binding(0)
            ty = T.get_thread_binding(1)
            over = ty if over_y else tx
            out = T.alloc_local((1,), T.float32)
            with T.attr(T.comm_reducer(combiner, [T.float32(0)]),  # <- combiner
                        "reduce_scope", T.reinterpret(T.uint64(0), dtype="handle")):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), A[tx], True, out[0], over))  # <- dim
            B[tx] = out[0]
    return main


def test_unsupported_combiner_is_an_error_at_its_line():
    _error_at(sum_allreduce_of, "x + y, T.max(x, y) or T.min(x, y)", lambda x, y: x * y, False,
              marker="# <- combiner")


def test_reduction_over_a_thread_dim_the_kernel_lacks_is_an_error_at_its_line():
    _error_at(sum_allreduce_of, "thread dimension y, which the kernel does not have",
              lambda x, y: x + y, True, marker="# <- dim")


def test_tvm_names_outside_the_allreduce_form_are_errors_at_their_line():
    def evaluate_other(n):
        @T.prim_func
        def main(A: T.Tensor((n,), T.float32)):
            with T.Kernel(1, threads=n) as bx:
                T.evaluate(A[0])  # <- error
        return main

    def allreduce_without_scope(n):
        @T.prim_func
        def main(A: T.Tensor((n,), T.float32), B: T.Tensor((n,), T.float32)):
            with T.Kernel(1, threads=n) as bx:
                tx = T.get_thread_binding(0)
                out = T.alloc_local((1,), T.float32)
                T.tvm_thread_allreduce(T.uint32(1), A[tx], True, out[0], tx)  # <- error
                B[tx] = out[0]
        return main
    _error_at(evaluate_other, "T.evaluate is TVM's expression statement", 64)
    _error_at(allreduce_without_scope, "enclosing `with T.attr(", 64)


def test_shuffle_inside_parallel_and_reducer_misuse_are_errors_at_their_line():
    def shuffle_in_parallel(n):
        @T.prim_func
        def main(A: T.Tensor((n,), T.float32), B: T.Tensor((n,), T.float32)):
            with T.Kernel(1, threads=n) as bx:
                for i in T.Parallel(n):
                    B[i] = T.shfl_xor(A[i], 1)  # <- error
        return main

    def reducer_read_while_updated(n):
        @T.prim_func
        def main(A: T.Tensor((n, n), T.float32), B: T.Tensor((n,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                r = T.alloc_reducer((n,), T.float32)
                T.clear(r)
                for i, j in T.Parallel(n, n):
                    r[i] = r[i] * A[i, j]  # <- error
                T.copy(r, B)
        return main
    _error_at(shuffle_in_parallel, "per-thread code: use it outside T.Parallel", 64)
    _error_at(reducer_read_while_updated, "updated inside T.Parallel as `r[i] += v`", 32)
