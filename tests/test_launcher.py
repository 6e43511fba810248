"""The direct launcher's specialization key (``triton_ext/launcher.py``): it must never give one
key to two arguments Triton would compile differently, or a cached kernel would be launched with
arguments it was not compiled for (an i32 parameter handed a 64-bit value, a constant 1 that is not
1). Checked against Triton's own ``native_specialize_impl`` on the values at every class edge."""
from __future__ import annotations

import pytest
import torch

from tilews.triton_ext.launcher import _specializer, _listening

INTS = [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
        -2**31, -2**31 - 1, -2**31 - 16, 2**40 * 3, 2**63 - 1, 2**63 - 16, 2**63, 2**63 + 16,
        2**64 - 1, 2**64 - 16]


def test_integer_classes_are_at_least_as_fine_as_tritons():
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    key = _specializer((int,), torch.Tensor)
    seen: dict = {}
    for v in INTS:
        triton = native_specialize_impl(BaseBackend, v, False, True, True)
        assert seen.setdefault(key([v]), triton) == triton, v


def test_tensors_by_alignment_and_other_arguments_by_nothing():
    key = _specializer((torch.Tensor, int, float, bool, object), torch.Tensor)
    base = torch.zeros(64)
    assert key([base, 16, 1.0, True, None])[0] is True
    assert key([base[1:], 16, 1.0, True, None])[0] is False
    assert key([base, 16, 2.5, False, "desc"]) == key([base, 16, 1.0, True, None])
    floats = _specializer((float,), torch.Tensor)
    assert floats([1.0]) == floats([2.5])


def test_integer_classes_remembered_per_tuple_of_values_stay_each_tuples_own():
    """A tuple of integers seen before reuses its classes; a new tuple gets its own."""
    key = _specializer((int, int), torch.Tensor)
    sixteen, one = (False, True, True, True), (True, False, True, True)
    assert key([16, 1]) == key([16, 1]) == ((sixteen, one),)
    assert key([1, 16]) == ((one, sixteen),)
    assert key([2**31 + 1, 16]) == (((False, False, False, True), sixteen),)


@pytest.mark.parametrize("calls, listening", [([], False), ([print], True)])
def test_an_empty_hook_chain_is_no_hook(calls, listening):
    from triton.knobs import HookChain
    chain = HookChain()
    chain.calls.extend(calls)
    assert (_listening(chain) is chain) is listening
    assert _listening(None) is None
