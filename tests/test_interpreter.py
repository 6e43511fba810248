"""The reference interpreter on single-role kernels: numerics against float64 torch references,
masking of boundary tiles, dtype conversions, integer semantics, reductions, atomics, poisoned
memory and argument checks. Warp-specialized programs are in test_interpreter_ws.py."""

import time

import pytest
import torch

import tilews.language as T
from tilews.lowering.errors import DeadlockError, OutOfBoundsError, UninitializedReadError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.interpreter import run

NAN = float("nan")


def line_of(tag: str) -> int:
    """The line of this file carrying the comment ``# <tag>``."""
    lines = open(__file__).read().splitlines()
    hits = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# <{tag}>")]
    assert len(hits) == 1, tag
    return hits[0]


def poisoned_view(shape, dtype, pad=3):
    """A strided view into a NaN-filled tensor with a border of ``pad``: the kernel's output, whose
    border must stay NaN (masked stores) and whose interior must be overwritten."""
    big = torch.full((shape[0] + 2 * pad, shape[1] + 2 * pad), NAN, dtype=torch.float64).to(dtype)
    return big, big[pad:pad + shape[0], pad:pad + shape[1]]


def assert_border_untouched(big, pad=3):
    inner = torch.zeros_like(big, dtype=torch.bool)
    inner[pad:-pad, pad:-pad] = True
    assert torch.isnan(big.double()[~inner]).all()


# ----------------------------------------------------------------------------------------------
# GEMM


def matmul(M, N, K, dtype, accum=T.float32, out_dtype=None, transpose_B=False, clear=True,
           block_M=64, block_N=64, block_K=32):
    c_dtype = out_dtype or dtype

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K) if transpose_B else (K, N), dtype),
             C: T.Tensor((M, N), c_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_N, block_K) if transpose_B else (block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            if clear:
                T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_s)
                if transpose_B:
                    T.copy(B[bx * block_N, k * block_K], B_s)
                else:
                    T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f, transpose_B=transpose_B)  # <gemm-no-clear>
            C_o = T.alloc_fragment((block_M, block_N), c_dtype)
            T.copy(C_f, C_o)
            T.copy(C_o, C[by * block_M, bx * block_N])
    return main


TOLERANCE = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 1e-2), torch.float32: (1e-5, 1e-4)}
TL_DTYPE = {torch.float16: T.float16, torch.bfloat16: T.bfloat16, torch.float32: T.float32}


@pytest.mark.parametrize("transpose_B", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gemm_ragged_matches_float64(dtype, transpose_B):
    M, N, K = 100, 72, 90          # no dimension is a multiple of its block (64, 64, 32)
    torch.manual_seed(0)
    A = torch.randn(M, K).to(dtype)
    B = torch.randn(K, N).to(dtype)
    if transpose_B:
        B = B.T          # a strided (column-major) view, as the kernel reads it in place
    big, C = poisoned_view((M, N), dtype)
    run(build_kernel(matmul(M, N, K, TL_DTYPE[dtype], transpose_B=transpose_B)), [A, B, C])
    ref = A.double() @ (B.double().T if transpose_B else B.double())
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(C.double(), ref, rtol=rtol, atol=atol)
    assert_border_untouched(big)


def test_gemm_256_cubed_is_fast():
    kernel = build_kernel(matmul(256, 256, 256, T.float16))
    A, B = torch.randn(256, 256).half(), torch.randn(256, 256).half()
    C = torch.full((256, 256), NAN).half()
    start = time.perf_counter()
    run(kernel, [A, B, C])
    elapsed = time.perf_counter() - start
    torch.testing.assert_close(C.double(), A.double() @ B.double(), rtol=1e-3, atol=1e-3)
    assert elapsed < 1.0, f"256^3 GEMM took {elapsed:.2f} s"


def test_accumulate_f64_holds_fragments_in_float64():
    M, N, K = 64, 64, 2048
    torch.manual_seed(1)
    A, B = torch.randn(M, K), torch.randn(K, N)
    ref = A.double() @ B.double()
    kernel = build_kernel(matmul(M, N, K, T.float32, out_dtype=T.float64))
    errors = {}
    for wide in (False, True):
        C = torch.full((M, N), NAN, dtype=torch.float64)
        run(kernel, [A, B, C], accumulate_f64=wide)
        errors[wide] = (C - ref).abs().max().item()
    assert errors[True] < 1e-11 < 1e-6 < errors[False]


def test_gemm_without_clear_reads_poisoned_fragment():
    kernel = build_kernel(matmul(64, 64, 64, T.float16, clear=False))
    A, B, C = torch.randn(64, 64).half(), torch.randn(64, 64).half(), torch.zeros(64, 64).half()
    with pytest.raises(UninitializedReadError) as e:
        run(kernel, [A, B, C])
    assert f"test_interpreter.py:{line_of('gemm-no-clear')}:" in str(e.value)
    assert "'C_f'" in str(e.value)
    # without checks the poison (NaN) flows into the result instead
    run(kernel, [A, B, C], check=False)
    assert torch.isnan(C.double()).all()


def split_k_gemm(M, N, K, splits, block=32):
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float32), B: T.Tensor((K, N), T.float32),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block), T.ceildiv(M, block), splits, threads=128) as (bx, by, bz):
            A_s = T.alloc_shared((block, block), T.float32)
            B_s = T.alloc_shared((block, block), T.float32)
            C_f = T.alloc_fragment((block, block), T.float32)
            T.clear(C_f)
            for k in T.unroll(T.ceildiv(K, block * splits)):
                T.copy(A[by * block, (bz + k * splits) * block], A_s)
                T.copy(B[(bz + k * splits) * block, bx * block], B_s)
                T.gemm(A_s, B_s, C_f)
            T.atomic_add(C[by * block, bx * block], C_f)
    return main


def test_split_k_tile_atomic_add_accumulates_into_output():
    M, N, K = 50, 40, 200
    torch.manual_seed(2)
    A, B, C0 = torch.randn(M, K), torch.randn(K, N), torch.randn(M, N)
    C = C0.clone()
    run(build_kernel(split_k_gemm(M, N, K, splits=3)), [A, B, C])
    torch.testing.assert_close(C.double(), C0.double() + A.double() @ B.double(), rtol=1e-5, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# element-wise: Parallel, masks, reductions, math


def softmax(M, N, block_M=16, block_N=64):
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            x = T.alloc_fragment((block_M, block_N), T.float32)
            row_max = T.alloc_fragment((block_M,), T.float32)
            row_sum = T.alloc_fragment((block_M,), T.float32)
            for i, j in T.Parallel(block_M, block_N):   # columns past N take -inf
                x[i, j] = T.if_then_else(j < N, X[bx * block_M + i, j], -T.infinity(T.float32))
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(block_M, block_N):
                x[i, j] = T.exp(x[i, j] - row_max[i])
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(block_M, block_N):   # stores past M or N are dropped
                Y[bx * block_M + i, j] = x[i, j] / row_sum[i]
    return main


def test_softmax_with_parallel_and_reductions():
    M, N = 50, 37
    torch.manual_seed(3)
    X = torch.randn(M, N) * 4
    big, Y = poisoned_view((M, N), torch.float32)
    run(build_kernel(softmax(M, N)), [X, Y])
    torch.testing.assert_close(Y.double(), torch.softmax(X.double(), dim=1), rtol=1e-5, atol=1e-7)
    assert_border_untouched(big)


def integer_ops(n):
    @T.prim_func
    def main(Q: T.Tensor((n,), T.int32), R: T.Tensor((n,), T.int32), W: T.Tensor((n,), T.int32),
             F: T.Tensor((n,), T.float32), X: T.Tensor((n,), T.int32), L: T.Tensor((n,), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(n):
                Q[i] = (i - 7) // 3
                R[i] = (i - 7) % 3
                W[i] = (i + 1) * 1000000007                   # wraps around in int32
                X[i] = T.cast(F[i], T.int32) ^ (i << 2)       # truncation toward zero
                L[i] = T.if_then_else((i > 3 and i < 9) or not i != 15, 1, 0)
    return main


def test_integer_semantics_follow_python_and_int32():
    n = 16
    Q, R, W, X, L = (torch.full((n,), -99, dtype=torch.int32) for _ in range(5))
    F = torch.linspace(-3.75, 3.75, n)
    run(build_kernel(integer_ops(n)), [Q, R, W, F, X, L])
    i = list(range(n))
    assert Q.tolist() == [(v - 7) // 3 for v in i]
    assert R.tolist() == [(v - 7) % 3 for v in i]
    assert W.tolist() == [((v + 1) * 1000000007 + 2**31) % 2**32 - 2**31 for v in i]
    assert X.tolist() == [int(f) ^ (v << 2) for v, f in zip(i, F.tolist())]
    assert L.tolist() == [int(3 < v < 9 or v == 15) for v in i]


def reductions(M, N):
    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Out: T.Tensor((3, M), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_shared((M, N), T.float32)
            lo = T.alloc_fragment((M,), T.float32)
            total = T.alloc_fragment((M,), T.float32)
            col = T.alloc_fragment((N,), T.float32)
            T.copy(X[0, 0], x)
            T.fill(lo, 0.25)
            T.reduce_min(x, lo, dim=1, clear=False)       # min(0.25, row minimum)
            T.fill(total, 10.0)
            T.reduce_abssum(x, total, dim=1, clear=False)  # 10 + sum |x|
            T.reduce_max(x, col, dim=0)
            T.copy(lo, Out[0, 0:M])
            T.copy(total, Out[1, 0:M])
            T.copy(col[0:M], Out[2, 0:M])
    return main


def test_reductions_combine_with_destination_when_not_cleared():
    M, N = 8, 12
    torch.manual_seed(4)
    X = torch.randn(M, N)
    Out = torch.full((3, M), NAN)
    run(build_kernel(reductions(M, N)), [X, Out])
    torch.testing.assert_close(Out[0], torch.clamp(X.min(dim=1).values, max=0.25))
    torch.testing.assert_close(Out[1], 10 + X.abs().sum(dim=1))
    torch.testing.assert_close(Out[2], X.max(dim=0).values[:M])


def histogram(L, bins, block=64):
    @T.prim_func
    def main(X: T.Tensor((L,), T.int32), H: T.Tensor((bins,), T.int32)):
        with T.Kernel(T.ceildiv(L, block), threads=128) as bx:
            for i in T.Parallel(block):
                if bx * block + i < L:
                    T.atomic_add(H[X[bx * block + i] % bins], 1)
    return main


def test_element_atomic_add_counts_every_lane():
    L, bins = 150, 7
    torch.manual_seed(5)
    X = torch.randint(0, bins, (L,), dtype=torch.int32)
    H = torch.full((bins,), 3, dtype=torch.int32)
    run(build_kernel(histogram(L, bins)), [X, H])
    assert H.tolist() == (3 + torch.bincount(X, minlength=bins)).tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_copies_round_like_torch(dtype):
    tl = {torch.bfloat16: T.bfloat16, torch.float16: T.float16, torch.float8_e4m3fn: T.float8_e4m3,
          torch.float8_e5m2: T.float8_e5m2}[dtype]

    def convert(n):
        @T.prim_func
        def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((n,), tl)):
            with T.Kernel(1, threads=128) as bx:
                f = T.alloc_fragment((n,), T.float32)
                y = T.alloc_fragment((n,), tl)
                T.copy(X[0:n], f)
                T.copy(f, y)
                T.copy(y, Y[0:n])
        return main

    torch.manual_seed(6)
    X = torch.cat([torch.randn(200) * 3, torch.tensor([1 + 2**-9, 1 + 3 * 2**-9, 470.0, -1e5])])
    Y = torch.zeros(len(X)).to(dtype)
    run(build_kernel(convert(len(X))), [X, Y])
    expect = X.to(dtype)
    assert torch.equal(Y.view(torch.uint8), expect.view(torch.uint8))


def masked_parallel(n):
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((n,), T.float32)
            for i in T.Parallel(n):
                if i < n // 2:
                    s[i] = X[i] * 2.0
            for i in T.Parallel(n):   # the unwritten half is only read on lanes the select skips
                Y[i] = T.if_then_else(i < n // 2, s[i], X[i])
            for i in T.Parallel(n):
                Y[i] = s[i] + 1.0  # <read-half-written>
    return main


def test_masked_lanes_do_not_read_and_unwritten_lanes_do():
    n = 16
    X = torch.randn(n)
    Y = torch.full((n,), NAN)
    with pytest.raises(UninitializedReadError) as e:
        run(build_kernel(masked_parallel(n)), [X, Y])
    message = str(e.value)
    assert f"test_interpreter.py:{line_of('read-half-written')}:" in message
    assert "'s'" in message and f"[{n // 2}]" in message
    torch.testing.assert_close(Y, torch.cat([X[:n // 2] * 2, X[n // 2:]]))


def running_sums(n):
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Out: T.Tensor((2,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_local((2,), T.float32)
            acc[0] = 0.0
            acc[1] = 0.0
            for k in T.serial(n):
                if X[k] > 0:
                    acc[0] = acc[0] + X[k]
                else:
                    acc[1] = T.min(acc[1], X[k])
            for i in T.Parallel(2):
                Out[i] = acc[i]
    return main


def test_scalar_stores_branches_and_loops_outside_parallel():
    torch.manual_seed(7)
    X = torch.randn(40)
    Out = torch.full((2,), NAN)
    run(build_kernel(running_sums(40)), [X, Out])
    torch.testing.assert_close(Out[0], X[X > 0].sum())
    torch.testing.assert_close(Out[1], X.min())


def shifted_store(n):
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((n,), T.float32)
            for i in T.Parallel(n):
                s[i + 1] = X[i]  # <shifted-store>
    return main


def test_on_chip_access_out_of_bounds_is_an_error():
    with pytest.raises(OutOfBoundsError) as e:
        run(build_kernel(shifted_store(8)), [torch.randn(8)])
    assert f"test_interpreter.py:{line_of('shifted-store')}:" in str(e.value)
    assert "[8]" in str(e.value) and "'s'" in str(e.value)


def dynamic_scale(N):
    @T.prim_func
    def main(X: T.Tensor((T.dynamic("m"), N), T.float32), Y: T.Tensor((T.dynamic("m"), N), T.float32)):
        with T.Kernel(T.ceildiv(X.shape[0], 32), threads=128) as bx:
            t = T.alloc_fragment((32, N), T.float32)
            T.copy(X[bx * 32, 0], t)
            for i, j in T.Parallel(32, N):
                t[i, j] = t[i, j] * 3.0 + 1.0
            T.copy(t, Y[bx * 32, 0])
    return main


def test_runtime_dims_and_argument_checks():
    kernel = build_kernel(dynamic_scale(8))
    names = [p.name for p in kernel.params]
    X = torch.randn(70, 8)
    Y = torch.full((70, 8), NAN)
    args = {"m": 70, "X": X, "Y": Y}
    run(kernel, [args[n] for n in names])
    torch.testing.assert_close(Y, X * 3 + 1)
    with pytest.raises(ValueError, match="dimension 0 of 'Y' is 69, but 'm' is 70 from 'X'"):
        run(kernel, [{**args, "Y": torch.zeros(69, 8)}[n] for n in names])
    with pytest.raises(TypeError, match="'X'.*dtype"):
        run(kernel, [{**args, "X": X.double()}[n] for n in names])


def lonely_wait():
    @T.prim_func
    def main(X: T.Tensor((4,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            bar = T.alloc_barrier(arrive_count=128)
            T.barrier_wait(bar, 0)  # <lonely-wait>
    return main


@pytest.mark.parametrize("check", [True, False])
def test_wait_nobody_completes_is_a_deadlock(check):
    with pytest.raises(DeadlockError) as e:
        run(build_kernel(lonely_wait()), [torch.zeros(4)], check=check)
    assert f"test_interpreter.py:{line_of('lonely-wait')}:" in str(e.value)
    assert "'bar'[0]" in str(e.value)


def test_a_returning_atomic_add_is_one_add_per_block_and_the_last_block_sums():
    # T.atomic_add(..., return_prev=True): each block sees the count before its own add (one add
    # per block, not per thread); the block that sees G - 1 arrived last and sums every partial
    from .test_tl_backend import last_block_sum
    G, N = 6, 64
    torch.manual_seed(7)
    X = torch.randn(G, N)
    P, Y = torch.full((G, N), float("nan")), torch.full((N,), float("nan"))
    count, order = torch.zeros(1, dtype=torch.int32), torch.full((G,), -1, dtype=torch.int32)
    kernel = last_block_sum(G, N)
    for _ in range(2):
        run(kernel, [X, P, count, order, Y])
        assert int(count) == 0 and order.tolist() == list(range(G))   # blocks run in grid order
        torch.testing.assert_close(Y.double(), 2 * X.double().sum(0), rtol=1e-6, atol=1e-6)


def test_shuffled_block_orders_find_a_program_counting_on_the_grid_order():
    from .test_tl_backend import last_block_sum
    G, N = 6, 64
    torch.manual_seed(8)
    X = torch.randn(G, N)
    want = 2 * X.double().sum(0)
    kernel, wrong = last_block_sum(G, N), last_block_sum(G, N, grid_order=True)
    orders, failures = set(), 0
    for seed in range(8):
        P, Y = torch.full((G, N), float("nan")), torch.full((N,), float("nan"))
        count, order = torch.zeros(1, dtype=torch.int32), torch.full((G,), -1, dtype=torch.int32)
        run(kernel, [X, P, count, order, Y], block_order=seed)
        torch.testing.assert_close(Y.double(), want, rtol=1e-6, atol=1e-6)
        assert int(count) == 0 and sorted(order.tolist()) == list(range(G))
        orders.add(tuple(order.tolist()))
        P, Y = torch.full((G, N), float("nan")), torch.full((N,), float("nan"))
        run(wrong, [X, P, count, order, Y], block_order=seed, check=False)
        failures += not torch.allclose(Y.double(), want)     # read partials not yet written
    assert len(orders) > 1 and failures > 0
    P, Y = torch.full((G, N), float("nan")), torch.full((N,), float("nan"))
    run(wrong, [X, P, count, order, Y])           # the grid's order hides it
    torch.testing.assert_close(Y.double(), want, rtol=1e-6, atol=1e-6)


def returning_atomic(where):
    @T.prim_func
    def main(C: T.Tensor((4,), T.int32), D: T.Tensor((4,), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            if where == "parallel":
                for i in T.Parallel(4):
                    T.atomic_add(C[i], 1, return_prev=True)
            elif where == "tile":
                T.atomic_add(C[0:4], D, return_prev=True)
            else:
                T.atomic_add(C[0], 1, memory_order="strongest")
    return main


@pytest.mark.parametrize("where, words", [
    ("parallel", "return_prev=True\\) inside T.Parallel is not supported"),
    ("tile", "return_prev=True\\) needs an element destination"),
    ("order", "memory_order='strongest'\\): must be one of 'relaxed', 'consume', 'acquire'"),
])
def test_returning_and_ordered_atomics_refuse_what_they_cannot_mean(where, words):
    import tilews
    with pytest.raises(tilews.CompileError, match=words) as e:
        build_kernel(returning_atomic(where))
    assert "test_interpreter.py" in str(e.value)
