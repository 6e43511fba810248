"""The thread level in the interpreter: the block barriers ``insert_syncs`` gives per-thread code,
and the interpreter's races between threads (``interpreter/thread_races.py``) when one is missing."""
from __future__ import annotations

import inspect

import dataclasses

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.errors import RaceError
from tilews.lowering.traverse import rewrite, walk

from .helpers import marked_line, poisoned, randn
from .thread_programs import splitk_gemv


def lowered(prog) -> ir.Kernel:
    """The IR the interpreter runs for ``prog`` (after its pipeline)."""
    return tilews.compile(prog, target="interpret").kernels[0].ir_after


def syncs(kernel: ir.Kernel) -> list[ir.BlockSync]:
    return [s for s in walk(kernel.body) if isinstance(s, ir.BlockSync)]


def without_sync(kernel: ir.Kernel, line: int) -> ir.Kernel:
    """``kernel`` less the barrier ``insert_syncs`` placed before the statement at ``line``."""
    assert [s.loc.line for s in syncs(kernel)].count(line) == 1
    body = rewrite(kernel.body, lambda s: ir.Seq((), s.loc)
                   if isinstance(s, ir.BlockSync) and s.loc.line == line else None)
    return dataclasses.replace(kernel, body=body)


# ----------------------------------------------------------------------------------------------
# split-K GEMV: each output row's dot product split over reduce_threads threads, summed by shared
# atomics (TileLang's gemv example, its split-K form)


def gemv_args(N, K, seed=0):
    A = randn(K, dtype=torch.float16, seed=seed)
    B = randn(N, K, dtype=torch.float16, seed=seed + 1)
    return A, B, poisoned(N, dtype=torch.float16)


@pytest.mark.parametrize("N, K, BLOCK_N, reduce_threads", [(256, 512, 4, 32), (64, 300, 8, 16)])
def test_splitk_gemv(N, K, BLOCK_N, reduce_threads):
    kernel = tilews.compile(splitk_gemv(N, K, BLOCK_N, reduce_threads), target="interpret")
    A, B, C = gemv_args(N, K)
    kernel(A, B, C)
    want = B.double() @ A.double()
    # float32 sums of fp16 products, rounded once to fp16
    torch.testing.assert_close(C.double(), want, rtol=2e-3, atol=2e-3)


def test_splitk_gemv_barriers_stand_before_the_shared_atomics_and_the_read():
    kernel = lowered(splitk_gemv(256, 512, 4, 32))
    atomic, read = marked_line(splitk_gemv, "# <- atomic"), marked_line(splitk_gemv, "# <- read")
    # the init's writes must be seen by every thread's atomic add, and every add by the read;
    # nothing else shares memory between threads (the per-thread locals are each thread's own)
    assert [(s.loc.line, s.device) for s in syncs(kernel)] == [(atomic, False), (read, False)]
    top = kernel.body.stmts
    for line in (atomic, read):
        k = next(i for i, s in enumerate(top) if isinstance(s, ir.BlockSync) and s.loc.line == line)
        after = top[k + 1]
        assert isinstance(after, ir.Parallel) and after.per_thread and after.loc.line == line


def test_missing_barrier_before_the_read_is_a_race_at_both_lines():
    N, K = 256, 512
    atomic, read = marked_line(splitk_gemv, "# <- atomic"), marked_line(splitk_gemv, "# <- read")
    kernel = without_sync(lowered(splitk_gemv(N, K, 4, 32)), read)
    with pytest.raises(RaceError) as info:
        interpreter.run(kernel, list(gemv_args(N, K)))
    text = str(info.value)
    assert f"thread_programs.py:{read}:" in text and f"thread_programs.py:{atomic}" in text
    assert "shared buffer 'C_shared'" in text
    # thread (x=0, y=0) reads element 0, which all 32 threads of x=0 added into
    assert "the read of element [0] by thread 0 (x=0, y=0)" in text
    assert "with the atomic add of it by several threads" in text


def test_missing_barrier_before_the_atomics_is_a_race_with_the_init():
    N, K = 256, 512
    init, atomic = marked_line(splitk_gemv, "# <- init"), marked_line(splitk_gemv, "# <- atomic")
    kernel = without_sync(lowered(splitk_gemv(N, K, 4, 32)), atomic)
    with pytest.raises(RaceError) as info:
        interpreter.run(kernel, list(gemv_args(N, K)))
    text = str(info.value)
    source = inspect.getsourcefile(splitk_gemv)
    assert text.startswith(f"{source}:{atomic}:")
    assert (f"the atomic add of element [0] by thread 124 (x=0, y=31) is not ordered by a block "
            f"barrier (T.sync_threads) with the write of it by thread 0 (x=0, y=0) at "
            f"{source}:{init}:") in text


def test_tile_level_kernels_get_no_barriers_in_the_interpreter():
    @T.prim_func
    def main(A: T.Tensor((64, 64), "float32"), B: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            S = T.alloc_shared((64, 64), "float32")
            T.copy(A, S)
            for i, j in T.Parallel(64, 64):
                S[i, j] = S[i, j] * 2
            T.copy(S, B)

    assert syncs(lowered(main)) == []


# ----------------------------------------------------------------------------------------------
# threads sharing shared memory


N_THREADS = 64


def neighbour(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((n,), "float32")
            S[tx] = A[tx] * 2  # <- write
            B[tx] = S[(tx + 1) % n] + 1  # <- neighbour
    return main


def test_reading_a_neighbours_element_gets_a_barrier_and_the_right_answer():
    n = N_THREADS
    write, line = marked_line(neighbour, "# <- write"), marked_line(neighbour, "# <- neighbour")
    kernel = lowered(neighbour(n))
    assert [s.loc.line for s in syncs(kernel)] == [line]
    A, B = randn(n), poisoned(n)
    tilews.compile(neighbour(n), target="interpret")(A, B)
    torch.testing.assert_close(B, torch.roll(A * 2, -1) + 1, rtol=0, atol=0)
    with pytest.raises(RaceError, match=rf"test_threads_races.py:{line}:.* data race on shared "
                                        rf"buffer 'S': the read of element \[0\] by thread {n - 1} "
                                        rf"is not ordered .* write of it by thread 0 at "
                                        rf".*test_threads_races.py:{write}:"):
        interpreter.run(without_sync(kernel, line), [A, poisoned(n)])


def own_element(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((n,), "float32")
            S[tx] = A[tx] * 2
            B[tx] = S[tx] + 1  # <- own
    return main


def test_reading_ones_own_element_needs_no_barrier():
    # insert_syncs decides by buffer, not element: it places one barrier (harmless) before the
    # read; without it the interpreter sees no race, since every thread reads only its own write
    n = N_THREADS
    line = marked_line(own_element, "# <- own")
    kernel = lowered(own_element(n))
    assert [s.loc.line for s in syncs(kernel)] == [line]
    A, B = randn(n), poisoned(n)
    interpreter.run(without_sync(kernel, line), [A, B])
    torch.testing.assert_close(B, A * 2 + 1, rtol=0, atol=0)


def copy_then_reverse(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((n,), "float32")
            T.copy(A, S)  # <- copy
            B[tx] = S[n - 1 - tx]  # <- reverse
    return main


def test_a_tile_copy_and_a_threads_read_race_without_the_barrier():
    n = N_THREADS
    copy, line = marked_line(copy_then_reverse, "# <- copy"), marked_line(copy_then_reverse, "# <- reverse")
    kernel = lowered(copy_then_reverse(n))
    A, B = randn(n), poisoned(n)
    tilews.compile(copy_then_reverse(n), target="interpret")(A, B)
    torch.testing.assert_close(B, A.flip(0), rtol=0, atol=0)
    with pytest.raises(RaceError, match=rf":{line}:.*the read of element \[0\] by thread {n - 1} "
                                        rf"is not ordered .* with the write of it by the block's "
                                        rf"threads together \(a tile operation\) at .*:{copy}:"):
        interpreter.run(without_sync(kernel, line), [A, poisoned(n)])


def uniform_then_each(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((1,), "float32")
            S[0] = A[0]             # every thread writes the same
            B[tx] = A[tx] + S[0]  # <- uniform
    return main


def test_a_uniform_write_read_by_every_thread_is_each_threads_own():
    n = N_THREADS
    line = marked_line(uniform_then_each, "# <- uniform")
    kernel = lowered(uniform_then_each(n))
    assert [s.loc.line for s in syncs(kernel)] == [line]
    A, B = randn(n), poisoned(n)
    interpreter.run(without_sync(kernel, line), [A, B])
    torch.testing.assert_close(B, A + A[0], rtol=0, atol=0)


def uniform_twice(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((1,), "float32")
            S[0] = A[0]  # <- first
            S[0] = S[0] * 2  # <- again
            B[tx] = S[0]
    return main


def test_two_uniform_writes_race_without_the_barrier():
    # one thread's first write may land after another's second
    n = N_THREADS
    first, again = marked_line(uniform_twice, "# <- first"), marked_line(uniform_twice, "# <- again")
    kernel = lowered(uniform_twice(n))
    assert [s.loc.line for s in syncs(kernel)] == [again, again + 1]
    with pytest.raises(RaceError, match=rf":{again}:.*the write of element \[0\] by every thread "
                                        rf".* with the write of it by every thread .*:{first}:"):
        interpreter.run(without_sync(kernel, again), [randn(n), poisoned(n)])


def shift_in_place(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((n,), "float32")
            S[tx] = A[tx]
            S[tx] = S[(tx + 1) % n]  # <- shift
            B[tx] = S[tx]
    return main


def test_one_statement_reading_what_another_thread_writes_is_a_race():
    # no barrier can stand inside one statement: thread tx reads S[tx + 1] while thread tx + 1
    # writes it (staging the value in a T.alloc_var is the fix: test_staged_shift_gets_its_barriers)
    n = N_THREADS
    line = marked_line(shift_in_place, "# <- shift")
    with pytest.raises(RaceError, match=rf":{line}:.*the write of element \[0\] by thread 0 is "
                                        rf"not ordered .* with the read of it by thread {n - 1} "
                                        rf"at .*:{line}:"):
        tilews.compile(shift_in_place(n), target="interpret")(randn(n), poisoned(n))


def staged_shift(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((n,), "float32")
            v = T.alloc_var("float32")
            S[tx] = A[tx]
            v = S[(tx + 1) % n]
            S[tx] = v
            B[tx] = S[(tx + 2) % n]
    return main


def test_staged_shift_gets_its_barriers():
    n = N_THREADS
    A, B = randn(n), poisoned(n)
    tilews.compile(staged_shift(n), target="interpret")(A, B)
    torch.testing.assert_close(B, torch.roll(A, -3), rtol=0, atol=0)
    assert len(syncs(lowered(staged_shift(n)))) == 3


# ----------------------------------------------------------------------------------------------
# control flow


def test_sync_threads_under_a_per_thread_condition_is_refused_at_its_line():
    def f(n):
        @T.prim_func
        def main(A: T.Tensor((n,), "float32")):
            with T.Kernel(1, threads=n):
                tx = T.get_thread_binding(0)
                S = T.alloc_shared((n,), "float32")
                S[tx] = A[tx]
                if tx < 16:
                    T.sync_threads()  # <- error
                A[tx] = S[n - 1 - tx]
        return main

    with pytest.raises(tilews.CompileError, match="a block barrier \\(T.sync_threads\\) under a "
                                                  "per-thread condition") as info:
        tilews.compile(f(32), target="interpret")
    assert info.value.loc.line == marked_line(f)


def test_loop_with_a_per_thread_trip_count():
    n, K = 32, 24

    @T.prim_func
    def main(X: T.Tensor((n, K), "float32"), counts: T.Tensor((n,), "int32"),
             Y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding(0)
            S = T.alloc_shared((n,), "float32")
            acc = T.alloc_var("float32")
            acc = 0
            for i in T.serial(counts[tx]):
                acc += X[tx, i]
            S[tx] = acc
            Y[tx] = S[n - 1 - tx]     # another thread's sum: behind a barrier

    X = randn(n, K)
    counts = torch.randint(0, K + 1, (n,), generator=torch.Generator().manual_seed(3),
                           dtype=torch.int32)
    counts[0], counts[1] = 0, K       # an empty loop and a full one
    Y = poisoned(n)
    tilews.compile(main, target="interpret")(X, counts, Y)
    sums = torch.stack([X[t, :int(counts[t])].double().sum() for t in range(n)])
    torch.testing.assert_close(Y.double(), sums.flip(0), rtol=1e-5, atol=1e-5)
