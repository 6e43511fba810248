"""Property tests: random block shapes, stage counts, dtypes and problem sizes for the GEMM and
softmax programs, on the interpreter and the triton.language backend, against float64 torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilews
import tilews.language as T
from examples.gemm import matmul
from examples.softmax import softmax

from .helpers import randn, rel_err

DTYPES = {"fp16": (T.float16, torch.float16, 1e-2), "bf16": (T.bfloat16, torch.bfloat16, 1e-2),
          "fp32": (T.float32, torch.float32, 1e-5)}
pow2 = lambda lo, hi: st.sampled_from([v for v in (8, 16, 32, 64, 128) if lo <= v <= hi])  # noqa: E731

gemm_cases = st.fixed_dictionaries({
    "M": st.integers(1, 130), "N": st.integers(1, 130), "K": st.integers(1, 130),
    "block_M": pow2(16, 64), "block_N": pow2(16, 64), "block_K": pow2(16, 64),
    "num_stages": st.integers(1, 4), "dtype": st.sampled_from(sorted(DTYPES)),
    "seed": st.integers(0, 2**16)})


def _check_gemm(case, target):
    tdt, dt, tol = DTYPES[case["dtype"]]
    factory = tilews.jit(out_idx=[-1], target=target)(matmul.fn)
    k = factory(case["M"], case["N"], case["K"], block_M=case["block_M"], block_N=case["block_N"],
                block_K=case["block_K"], num_stages=case["num_stages"], dtype=tdt)
    a = randn(case["M"], case["K"], dtype=dt, seed=case["seed"])
    b = randn(case["K"], case["N"], dtype=dt, seed=case["seed"] + 1)
    c = k(a, b)
    assert rel_err(c, a.double() @ b.double()) < tol


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gemm_cases)
def test_gemm_interpreter(case):
    _check_gemm(case, "interpret")


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gemm_cases)
def test_gemm_triton(case):
    _check_gemm(case, "triton")


softmax_cases = st.fixed_dictionaries({
    "M": st.integers(1, 70), "N": pow2(8, 128), "block_M": pow2(8, 32),
    "scale": st.floats(0.1, 20), "seed": st.integers(0, 2**16)})


def _check_softmax(case, target):
    k = tilews.jit(out_idx=[-1], target=target)(softmax.fn)(case["M"], case["N"], block_M=case["block_M"])
    x = randn(case["M"], case["N"], seed=case["seed"]) * case["scale"]
    assert rel_err(k(x), torch.softmax(x.double(), 1)) < 1e-5


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(softmax_cases)
def test_softmax_interpreter(case):
    _check_softmax(case, "interpret")


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(softmax_cases)
def test_softmax_triton(case):
    _check_softmax(case, "triton")
