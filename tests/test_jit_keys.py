"""The specialization key of ``@tilews.jit``'s three styles (``tilews.keys.specialization_key``):
one rule, seen through each style's behaviour.

The same kernel scales a vector by a number made from a build-time argument ``factor`` of any
kind (``weight``), written as a factory, in the eager style and in the direct style. For each
style: arguments equal by content hit the memo (fresh lists, tuples, dicts in another order, a
torch dtype, a tilews dtype, objects whose class hashes by content); values of different kinds
(``True``, ``1``, ``1.0``; a list and a tuple) are different keys; objects whose reprs are equal
but contents differ do not collide (the direct style keyed on ``repr`` before); an object with
the default identity hash hits when it is the same object and only then; an object with no hash
is a ``TypeError`` naming the parameter in the eager and direct styles and compiles without the
memo in the factory style (the README's documented behaviour). Each kernel's result is checked
against ``a * weight(factor)`` (outputs poisoned by the conftest).
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.compiler import BuildRequest, CompileConfig, compile_kernel
from tilews.lowering.dtypes import DType

N = 8


class Labelled:
    """Equal reprs whatever the content; equality and hash by content."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return "Labelled"

    def __eq__(self, other):
        return isinstance(other, Labelled) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


class Opaque:
    """The default identity hash and a default repr."""
    value = 5.0


class NoHash:
    """``__eq__`` without ``__hash__``: not hashable."""
    value = 7.0

    def __eq__(self, other):
        return isinstance(other, NoHash)


def weight(x) -> float:
    """A number made from a build-time argument of any kind."""
    if isinstance(x, (list, tuple)):
        return float(sum(weight(v) for v in x))
    if isinstance(x, dict):
        return float(sum(weight(k) * weight(v) for k, v in x.items()))
    if isinstance(x, DType):
        return float(x.bits)
    if isinstance(x, torch.dtype):
        return float(x.itemsize)
    if isinstance(x, str):
        return float(len(x))
    if isinstance(x, (int, float)):
        return float(x) + (0.5 if isinstance(x, bool) else 0.25 if isinstance(x, float) else 0)
    return float(x.value)


@tilews.jit(out_idx=[-1], target="interpret")
def factory(n, factor):
    f = weight(factor)

    @T.prim_func
    def main(A: T.Tensor((n,), T.float32), C: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128):
            A_f = T.alloc_fragment((n,), T.float32)
            T.copy(A, A_f)
            for i in T.Parallel(n):
                A_f[i] = A_f[i] * f
            T.copy(A_f, C)
    return main


@tilews.jit(target="interpret")
def eager(A, factor):
    n = T.const("n")
    A: T.Tensor((n,), T.float32)
    C = T.empty((n,), T.float32)
    f = weight(factor)
    with T.Kernel(1, threads=128):
        A_f = T.alloc_fragment((n,), T.float32)
        T.copy(A, A_f)
        for i in T.Parallel(n):
            A_f[i] = A_f[i] * f
        T.copy(A_f, C)
    return C


@tilews.jit(out_idx=[-1], target="interpret")
def direct(A: T.Tensor[("n",), T.float32], C: T.Tensor[("n",), T.float32], factor):
    f = weight(factor)
    with T.Kernel(1, threads=128):
        A_f = T.alloc_fragment((n,), T.float32)
        T.copy(A, A_f)
        for i in T.Parallel(n):
            A_f[i] = A_f[i] * f
        T.copy(A_f, C)


A = torch.arange(1, N + 1, dtype=torch.float32)
STYLES = {
    "factory": lambda factor: factory(N, factor),
    "eager": lambda factor: eager.compile(A, factor),
    "direct": lambda factor: direct.compile(A, factor=factor),
}


def compiled(style: str, factor):
    """The style's kernel for ``factor``, its result checked."""
    kernel = STYLES[style](factor)
    torch.testing.assert_close(kernel(A), A * weight(factor), rtol=0, atol=0)
    return kernel


EQUAL_CONTENT = {
    "list": lambda: [1, 2, 3],
    "nested": lambda: (1, [2, (3, "x")], {"k": [4]}),
    "dict": lambda: {"a": 1, "b": 2.5},
    "torch dtype": lambda: torch.float16,
    "tilews dtype": lambda: T.bfloat16,
    "content hash": lambda: Labelled(3),
}


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("kind", sorted(EQUAL_CONTENT))
def test_equal_contents_hit_the_memo(style, kind):
    make = EQUAL_CONTENT[kind]
    if style == "direct" and kind == "tilews dtype":
        # a direct-style parameter given a tilews dtype is a runtime scalar of that dtype (the
        # frontend's rule for dtype specs), so the dtype goes in a tuple here
        make = lambda: (T.bfloat16,)    # noqa: E731
    first = compiled(style, make())
    assert compiled(style, make()) is first


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_dict_in_another_order_hits(style):
    assert compiled(style, {"a": 1, "b": 2.5}) is compiled(style, {"b": 2.5, "a": 1})


@pytest.mark.parametrize("style", sorted(STYLES))
def test_kinds_are_part_of_the_key(style):
    # True == 1 == 1.0 in Python, and [2, 3] == (2, 3) as contents: each is its own kernel
    kernels = [compiled(style, v) for v in (True, 1, 1.0, [2, 3], (2, 3), 2.0, -0.0)]
    assert len({id(k) for k in kernels}) == len(kernels)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_equal_reprs_with_different_contents_do_not_collide(style):
    two, three = compiled(style, Labelled(2)), compiled(style, Labelled(3))
    assert repr(Labelled(2)) == repr(Labelled(3)) and two is not three


@pytest.mark.parametrize("style", sorted(STYLES))
def test_identity_hashed_objects_hit_when_the_same(style):
    thing = Opaque()
    first = compiled(style, thing)
    assert compiled(style, thing) is first
    assert compiled(style, Opaque()) is not first        # another object: another key


@pytest.mark.parametrize("style", ["eager", "direct"])
def test_an_unhashable_argument_is_an_error_naming_it(style):
    with pytest.raises(TypeError, match=r"argument 'factor' \(NoHash\) is not hashable"):
        STYLES[style](NoHash())


def test_the_factory_compiles_unhashable_arguments_without_the_memo():
    first = compiled("factory", NoHash())
    assert compiled("factory", NoHash()) is not first


def test_the_factory_keys_arguments_by_parameter_name():
    assert factory(N, [1, 2]) is factory(N, factor=[1, 2]) is factory(n=N, factor=[1, 2])


def test_the_factorys_quick_memo_keeps_kinds_and_float_bits_apart():
    """Flat arguments seen before are found without binding (keys.call_key): the second call of
    each value is the first's kernel, and values Python calls equal stay apart."""
    values = (True, 1, 1.0, 0.0, -0.0, T.float16, torch.float16)
    first = [compiled("factory", v) for v in values]
    assert len({id(k) for k in first}) == len(values)
    assert all(factory(N, v) is k for v, k in zip(values, first))
    assert factory(N, factor=1) is factory(n=N, factor=1) is first[1]


def test_compile_kernel_takes_a_request_and_a_config():
    @T.prim_func
    def double(A: T.Tensor((N,), T.float32), C: T.Tensor((N,), T.float32)):
        with T.Kernel(1, threads=128):
            A_f = T.alloc_fragment((N,), T.float32)
            T.copy(A, A_f)
            for i in T.Parallel(N):
                A_f[i] = A_f[i] * 2
            T.copy(A_f, C)
    kernel = compile_kernel(BuildRequest.of(double, out_idx=[-1]), CompileConfig("interpret"))
    assert kernel.target == "interpret"
    torch.testing.assert_close(kernel(A), A * 2, rtol=0, atol=0)
