"""The CPU targets these tests run on, as ``target`` parameters: the reference interpreter,
Triton's CPU interpreter and Metal (its MSL run by the CPU harness; needs a C++17 compiler)."""
import pytest

from tilews.metal.harness import compiler

CPU_TARGETS = ("interpret", "triton") + (("metal",) if compiler() else ())

# Triton's CPU interpreter runs every program instance in Python: a test that launches a large
# grid (a persistent kernel's one block per SM) or launches many times (tuning, benchmarking)
# takes several seconds there, so its triton case is marked slow.
SLOW_ON_TRITON = pytest.mark.parametrize(
    "target", ["interpret", pytest.param("triton", marks=pytest.mark.slow)])
