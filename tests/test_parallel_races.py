"""Races between the iterations of a ``T.Parallel`` (issue 42, item 3).

Two iterations writing one element, or one reading what another writes, gave a different answer
on each target (16 on the interpreter, the sum on Metal, a CompileError on triton). Where the
indices decide it, every target refuses the program at the store's line
(``lowering/frontend/parallel_races.py``); where values decide it (an index read from a tensor),
the interpreter raises ``RaceError`` naming the line and two iterations
(``lowering/interpreter/iteration_races.py``). The programs that are not races run everywhere:
stores indexed by every variable (also through ``i * N + j`` or a permutation read from a tensor),
stores guarded to one iteration, ``T.atomic_add``, reducers and ``T.reduce_sum``.
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.errors import RaceError
from tilews.metal import harness

from .helpers import marked_line, poisoned, randn

M, N = 4, 8
CPU_TARGETS = ["interpret", "triton"]
METAL = pytest.param("metal", marks=pytest.mark.skipif(harness.compiler() is None,
                                                       reason="the Metal harness needs g++ or clang++"))
TARGETS = CPU_TARGETS + [METAL]


def accumulate_into_fragment():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((M, N), "float32")
            y = T.alloc_fragment((M,), "float32")
            T.copy(X, x)
            T.clear(y)
            for i, j in T.Parallel(M, N):
                y[i] = y[i] + x[i, j]  # <- error
            T.copy(y, Y)
    return main


def every_column_writes_one_element():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                Y[i] = X[i, j]  # <- error
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("factory, buffer", [(accumulate_into_fragment, "y"),
                                             (every_column_writes_one_element, "Y")])
def test_a_store_missing_a_loop_variable_is_refused_on_every_target(factory, buffer, target):
    with pytest.raises(tilews.CompileError) as info:
        tilews.compile(factory(), target=target)
    e = info.value
    assert type(e) is tilews.CompileError, repr(e)
    assert e.message.startswith(f"race in T.Parallel: this store into '{buffer}' does not use "
                                f"loop variable 'j'"), e.message
    assert f"all {N} iterations of 'j'" in e.message
    assert e.loc.file == __file__ and e.loc.line == marked_line(factory), str(e)


def scatter_by_index():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), P: T.Tensor((M, N), "int32"),
             Y: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                Y[i, P[i, j]] = X[i, j]  # <- error
    return main


def permutations(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(N, generator=g) for _ in range(M)]).int()


@pytest.mark.parametrize("target", TARGETS)
def test_a_scatter_through_a_permutation_is_not_a_race(target):
    x, p = randn(M, N, seed=1), permutations(2)
    y = poisoned(M, N)
    tilews.compile(scatter_by_index(), target=target)(x, p, y)
    assert torch.equal(y.gather(1, p.long()), x)


def test_a_scatter_with_a_repeated_index_is_a_race_the_interpreter_reports():
    x, p = randn(M, N, seed=1), permutations(2)
    p[2, 5] = p[2, 1]
    with pytest.raises(RaceError) as info:
        tilews.compile(scatter_by_index(), target="interpret")(x, p, poisoned(M, N))
    text = str(info.value)
    line = marked_line(scatter_by_index)
    assert text.startswith(f"{__file__}:{line}:"), text
    assert (f"data race in T.Parallel on 'Y': the write of element [2, {int(p[2, 1])}] by "
            f"iteration (i=2, j=1) meets the write of it by iteration (i=2, j=5) at "
            f"{__file__}:{line}:") in text


def shift_by_index():
    @T.prim_func
    def main(P: T.Tensor((N,), "int32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                Y[P[i]] = Y[i] * 2.0  # <- error
    return main


def test_reading_an_element_another_iteration_writes_is_a_race_the_interpreter_reports():
    y = randn(N, seed=3)
    identity = torch.arange(N, dtype=torch.int32)
    out = y.clone()
    tilews.compile(shift_by_index(), target="interpret")(identity, out)
    assert torch.equal(out, y * 2)
    shifted = torch.roll(identity, 1)       # iteration i writes Y[i - 1], which i - 1 reads
    with pytest.raises(RaceError) as info:
        tilews.compile(shift_by_index(), target="interpret")(shifted, y.clone())
    text = str(info.value)
    assert text.startswith(f"{__file__}:{marked_line(shift_by_index)}:"), text
    assert "data race in T.Parallel on 'Y': the read of element [0] by iteration (i=0) meets " \
           "the write of it by iteration (i=1)" in text


def shift_in_place():
    @T.prim_func
    def main(Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N - 1):
                Y[i + 1] = Y[i]  # <- error
    return main


def read_first_column(scope: str):
    """Iteration (i, j) reads a[i, 0], which iteration (i, 0) writes (``scope`` is a build-time
    value: a fragment or shared)."""
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_fragment((M, N), "float32") if scope == "fragment" \
                else T.alloc_shared((M, N), "float32")
            T.copy(X, a)
            for i, j in T.Parallel(M, N):
                a[i, j] = a[i, 0] * 2.0  # <- error
            T.copy(a, Y)
    return main


def read_first_column_of_global():
    @T.prim_func
    def main(Y: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                Y[i, j] = Y[i, 0] * 2.0  # <- error
    return main


def reverse_in_shared():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((N,), "float32")
            T.copy(X, s)
            for i in T.Parallel(N):
                s[i] = s[N - 1 - i]  # <- error
            T.copy(s, Y)
    return main


def diagonal_sums():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M + N,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                Y[i + j] = X[i, j]  # <- error
    return main


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("factory, args, message", [
    (shift_in_place, (), "iteration (i=1) reads element [1] of 'Y', which iteration (i=0) writes"),
    (read_first_column, ("fragment",),
     "iteration (i=0, j=1) reads element [0, 0] of 'a', which iteration (i=0, j=0) writes"),
    (read_first_column, ("shared",),
     "iteration (i=0, j=1) reads element [0, 0] of 'a', which iteration (i=0, j=0) writes"),
    (read_first_column_of_global, (),
     "iteration (i=0, j=1) reads element [0, 0] of 'Y', which iteration (i=0, j=0) writes"),
    (reverse_in_shared, (), f"iteration (i={N - 1}) reads element [0] of 's', which iteration (i=0) "
                        f"writes"),
    (diagonal_sums, (), "iteration (i=1, j=0) writes element [1] of 'Y', which iteration (i=0, j=1) "
                    "writes"),
], ids=["shift", "fragment", "shared", "global", "reverse", "diagonal"])
def test_iterations_meeting_on_an_element_by_their_indices_is_refused_on_every_target(
        factory, args, message, target):
    with pytest.raises(tilews.CompileError) as info:
        tilews.compile(factory(*args), target=target)
    e = info.value
    assert type(e) is tilews.CompileError, repr(e)
    assert e.message.startswith(f"race in T.Parallel: {message}"), e.message
    assert e.loc.file == __file__ and e.loc.line == marked_line(factory), str(e)


# ---- programs that are not races run on every target ------------------------------------------

def flattened():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M * N,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                Y[i * N + j] = X[i, j] + 1.0
    return main


def guarded_to_one_column():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                if j == N - 1:
                    Y[i] = X[i, j] * 2.0
    return main


def row_sums(how: str):
    """Y[i] = sum_j X[i, j] the three ways that combine iterations: atomic adds, a reducer, and
    T.reduce_sum (``how`` is a build-time value)."""
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            if how == "atomic_add":
                for i, j in T.Parallel(M, N):
                    T.atomic_add(Y[i], X[i, j])
            elif how == "reducer":
                r = T.alloc_reducer((M,), "float32", op="sum")
                T.clear(r)
                for i, j in T.Parallel(M, N):
                    r[i] += X[i, j]
                T.finalize_reducer(r)
                T.copy(r, Y)
            else:
                x = T.alloc_fragment((M, N), "float32")
                y = T.alloc_fragment((M,), "float32")
                T.copy(X, x)
                T.reduce_sum(x, y, dim=1)
                T.copy(y, Y)
    return main


def in_place(how: str):
    """a[i, j] rewritten from reads that no other iteration writes (``how``, a build-time value):
    its own element and another buffer's, or a[i, 0] only where j == 0 (T.if_then_else)."""
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_fragment((M, N), "float32")
            T.copy(X, a)
            for i, j in T.Parallel(M, N):
                if how == "scale":
                    a[i, j] = a[i, j] * 2.0 + X[i, 0]
                else:
                    a[i, j] = T.if_then_else(j == 0, a[i, 0] * 2.0, a[i, j])
            T.copy(a, Y)
    return main


def upper_half_into_lower():
    """Iteration i reads s[i + M] and writes s[i]: the halves never meet."""
    @T.prim_func
    def main(X: T.Tensor((2 * M,), "float32"), Y: T.Tensor((2 * M,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((2 * M,), "float32")
            T.copy(X, s)
            for i in T.Parallel(M):
                s[i] = s[i + M] - s[i]
            T.copy(s, Y)
    return main


def _doubled_first_column(x):
    y = x.double().clone()
    y[:, 0] *= 2
    return y


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("factory, ref, out", [
    (flattened, lambda x: (x.double() + 1).flatten(), (M * N,)),
    (guarded_to_one_column, lambda x: x.double()[:, -1] * 2, (M,)),
    (lambda: row_sums("atomic_add"), lambda x: x.double().sum(1), None),
    (lambda: row_sums("reducer"), lambda x: x.double().sum(1), (M,)),
    (lambda: row_sums("reduce_sum"), lambda x: x.double().sum(1), (M,)),
    (lambda: in_place("scale"), lambda x: x.double() * 2 + x.double()[:, :1], (M, N)),
    (lambda: in_place("guarded_read"), _doubled_first_column, (M, N)),
], ids=["flattened", "guarded", "atomic_add", "reducer", "reduce_sum", "in_place",
        "guarded_read"])
def test_programs_without_races_run(factory, ref, out, target):
    x = randn(M, N, seed=4)
    y = torch.zeros(M) if out is None else poisoned(*out)    # atomics add into zeros
    tilews.compile(factory(), target=target)(x, y)
    torch.testing.assert_close(y.double(), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_halves_that_never_meet_are_not_a_race(target):
    x = randn(2 * M, seed=6)
    y = poisoned(2 * M)
    tilews.compile(upper_half_into_lower(), target=target)(x, y)
    want = x.double().clone()
    want[:M] = x.double()[M:] - x.double()[:M]
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)
