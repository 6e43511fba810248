"""TileLang's examples, rewritten at small sizes, run on tilews's CPU targets.

Each module holds the programs of one or more TileLang examples, written against the surface the
example uses (``import tilews as tilelang``-style), and checks them with the example's own
reference and tolerances. A test takes the ``target`` fixture to run on every CPU target: the
reference interpreter, Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by
``tests/conftest.py``) and Metal through its CPU harness (``targets.CPU_TARGETS``);
``targets.SLOW_ON_TRITON`` instead runs a test on the first two and marks the triton case slow. The examples
leave the target to ``"auto"``; here each program is built by a cached ``*_for(target)`` function
that passes ``target=`` to ``tilews.jit``, so the tests on one target share its compiled kernels.
"""
from __future__ import annotations

import pytest
import torch

from .targets import CPU_TARGETS


@pytest.fixture(params=CPU_TARGETS)
def target(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _seeded():
    """Random inputs (the tests' and the profiler's) are the same on every run."""
    torch.manual_seed(0)
