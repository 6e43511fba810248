"""The eager style reads declarations as TileLang does (issue 37, item 3): the body runs up to
``with T.Kernel`` with every ``T.const`` name a symbol, so shapes built in local variables, under
conditionals, as expressions, or written as a scalar bind from the tensors passed; a name no
tensor determines is an error naming it."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import randn

TARGETS = ["interpret", "triton"]
DECLARATION_RUNS: list = []    # one entry per run of scale_groups's declarations


def _scale_groups(target):
    @tilews.jit(target=target)
    def scale_groups(X, S, block_M=16, group=8, transposed=False):
        """Rows of X (transposed: columns) scaled by a per-group factor (DeepGEMM-style shapes)."""
        M, K = T.const("M, K")
        DECLARATION_RUNS.append(M)
        x_shape = (M, K) if not transposed else (K, M)
        scales_shape = (T.ceildiv(M, group),)
        X: T.Tensor(x_shape, T.float32)
        S: T.Tensor(scales_shape, T.float32)
        Y = T.empty((M, K), T.float32)
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            for i, j in T.Parallel(block_M, K):
                r = bx * block_M + i
                if r < M:
                    if transposed:
                        Y[r, j] = X[j, r] * S[r // group]
                    else:
                        Y[r, j] = X[r, j] * S[r // group]
        return Y
    return scale_groups


def _scale_ref(x, s, group):
    return x.double() * s.double().repeat_interleave(group)[:x.shape[0], None]


@pytest.mark.parametrize("target", TARGETS)
def test_shapes_built_in_locals_and_under_a_conditional_bind_from_the_tensors(target):
    fn = _scale_groups(target)
    x, s = randn(40, 32, seed=1), randn(5, seed=2)
    torch.testing.assert_close(fn(x, s).double(), _scale_ref(x, s, 8), rtol=1e-6, atol=1e-6)
    # the other branch: M is now dimension 1 of X
    torch.testing.assert_close(fn(x.t().contiguous(), s, transposed=True).double(),
                               _scale_ref(x, s, 8), rtol=1e-6, atol=1e-6)


def test_declarations_run_symbolically_once_per_set_of_build_time_values():
    fn = _scale_groups("interpret")
    DECLARATION_RUNS.clear()
    fn(randn(40, 24, seed=1), randn(5, seed=2))
    fn(randn(24, 24, seed=3), randn(3, seed=4))       # new M: a new build, not a new symbolic run
    symbolic = [m for m in DECLARATION_RUNS if not isinstance(m, int)]
    assert len(symbolic) == 1 and sorted(m for m in DECLARATION_RUNS if isinstance(m, int)) == [24, 40]


@tilews.jit(target="interpret")
def gather_pairs(A, X):
    n = T.const("n")
    A: T.Tensor((2 * n + 1,), T.float32)        # an expression of n only
    X: T.Tensor[(n), T.float32]                  # a shape written as a scalar
    Y = T.empty((n,), T.float32)
    with T.Kernel(1, threads=32):
        for i in T.Parallel(n):
            Y[i] = A[2 * i + 1] + X[i]
    return Y


@tilews.jit(target="interpret")
def odd_part(A):
    n = T.const("n")
    A: T.Tensor((2 * n + 1,), T.float32)
    Y = T.empty((n,), T.float32)
    with T.Kernel(1, threads=32):
        for i in T.Parallel(n):
            Y[i] = A[2 * i + 1]
    return Y


def test_a_scalar_shape_and_an_affine_dimension_bind():
    a, x = randn(9, seed=5), randn(4, seed=6)
    torch.testing.assert_close(gather_pairs(a, x), a[1::2] + x)
    # n only in 2 * n + 1: solved from A's size
    torch.testing.assert_close(odd_part(a), a[1::2])
    with pytest.raises(ValueError, match=r"'A' has size 8 in dimension 0, which is declared "
                                         r"dimension 0 of 'A' \(2 \* n \+ 1\)"):
        odd_part(randn(8, seed=7))


@tilews.jit(target="interpret")
def square_only(A):
    n = T.const("n")
    A: T.Tensor((n * n,), T.float32)
    Y = T.empty((n,), T.float32)
    with T.Kernel(1, threads=32):
        for i in T.Parallel(n):
            Y[i] = A[i * n + i]
    return Y


def test_a_name_no_tensor_determines_is_an_error_naming_it_unless_given_by_keyword():
    a = randn(16, seed=8)
    with pytest.raises(ValueError, match="no declared tensor determines T.const 'n'.*n=\\.\\.\\."):
        square_only(a)
    torch.testing.assert_close(square_only(a, n=4), a[::5])


@tilews.jit(target="interpret")
def tiles_by_size(A, small_block=16):
    M = T.const("M")
    A: T.Tensor((M,), T.float32)
    block = 32 if M > 64 else small_block       # needs M's value before the kernel
    Y = T.empty((M,), T.float32)
    with T.Kernel(T.ceildiv(M, block), threads=32) as bx:
        for i in T.Parallel(block):
            if bx * block + i < M:
                Y[bx * block + i] = A[bx * block + i] * 2
    return Y


def test_declarations_that_need_a_value_fall_back_to_the_whole_dimensions_written():
    for n in (40, 100):
        a = randn(n, seed=n)
        torch.testing.assert_close(tiles_by_size(a), 2 * a)
