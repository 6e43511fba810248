"""The CPU targets these tests run on, as ``target`` parameters."""
import pytest

CPU_TARGETS = ("interpret", "triton")

# Triton's CPU interpreter runs every program instance in Python: a test that launches a large
# grid (a persistent kernel's one block per SM) or launches many times (tuning, benchmarking)
# takes several seconds there, so its triton case is marked slow.
SLOW_ON_TRITON = pytest.mark.parametrize(
    "target", ["interpret", pytest.param("triton", marks=pytest.mark.slow)])
