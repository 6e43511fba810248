"""An on-chip index out of bounds at runtime is an error on the interpreter and on Metal (issue 42,
item 6).

The interpreter raises ``OutOfBoundsError`` at the user's line; Metal's CPU harness read and wrote
past its threadgroup arrays silently (a gather through ``s[P[i]]`` with ``P[3] = 12`` returned a
number). The harness's checked build (its default, ``metal/harness.py``) now fails the launch with
``HarnessOutOfBounds``, an ``OutOfBoundsError`` naming the array, the index and the user's line.
"""
from __future__ import annotations

import os
import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.errors import OutOfBoundsError
from tilews.metal import harness

from .helpers import marked_line, poisoned, randn

N = 16
METAL = pytest.param("metal", marks=pytest.mark.skipif(harness.compiler() is None,
                                                       reason="the Metal harness needs g++ or clang++"))
TARGETS = ["interpret", METAL]


def gather(scope: str):
    """Y[i] = 2 * X[P[i]] through an on-chip copy of X (``scope`` is a build-time value)."""
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), P: T.Tensor((N,), "int32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            s = T.alloc_shared((N,), "float32") if scope == "shared" \
                else T.alloc_fragment((N,), "float32")
            T.copy(X, s)
            for i in T.Parallel(N):
                Y[i] = s[P[i]] * 2.0  # <- error
    return main


def scatter():
    """Y[P[i]] = X[i] through a shared buffer."""
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), P: T.Tensor((N,), "int32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            s = T.alloc_shared((N,), "float32")
            for i in T.Parallel(N):
                s[P[i]] = X[i]  # <- error
            T.copy(s, Y)
    return main


def permutation(seed: int) -> torch.Tensor:
    return torch.randperm(N, generator=torch.Generator().manual_seed(seed)).int()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("scope", ["shared", "fragment"])
def test_a_gather_inside_the_buffer_runs(scope, target):
    x, p, y = randn(N, seed=1), permutation(2), poisoned(N)
    tilews.compile(gather(scope), target=target)(x, p, y)
    torch.testing.assert_close(y.double(), x.double()[p.long()] * 2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("factory, args", [(gather, ("shared",)), (gather, ("fragment",)),
                                           (scatter, ())], ids=["gather-shared", "gather-fragment",
                                                                "scatter"])
@pytest.mark.parametrize("bad", [N + 3, -1])
def test_an_on_chip_index_outside_the_buffer_is_an_error(factory, args, bad, target):
    p = permutation(3)
    p[5] = bad
    kernel = tilews.compile(factory(*args), target=target)
    with pytest.raises(OutOfBoundsError) as info:
        kernel(randn(N, seed=4), p, poisoned(N))
    text = str(info.value)
    line = marked_line(factory)
    if target == "interpret":
        assert text.startswith(f"{__file__}:{line}:"), text
        assert f"index [{bad}] is outside" in text and f"buffer 's' (shape [{N}])" in text, text
    else:
        assert re.search(rf"lane 5: index {bad} is outside on-chip array s\[{N}\] \(line \d+\)\n"
                         rf"  main_\.metal:\d+: .*\(from {os.path.basename(__file__)}:{line}\)$",
                         text), text


@pytest.mark.skipif(harness.compiler() is None, reason="the Metal harness needs g++ or clang++")
def test_the_unchecked_harness_build_does_not_look():
    """What the checked build adds: the same kernel text compiled as it is runs past the array."""
    program = tilews.compile(gather("shared"), target="metal").program
    p = permutation(3)
    p[5] = N + 3
    args = [randn(N, seed=4), p, poisoned(N)]
    harness.build(program.msl, checked=False).run(args, program.grid(args))
    with pytest.raises(harness.HarnessOutOfBounds):
        harness.build(program.msl).run(args, program.grid(args))
