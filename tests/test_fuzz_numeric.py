"""Differential fuzzing of the numeric contract (docs/design.md §3) on ``interpret``, ``triton``
(Triton's CPU interpreter) and ``metal`` (its C++ harness).

hypothesis draws random tile programs — elementwise chains (``numeric_chains``), reductions
along either dim of ragged tiles, optionally over a ``T.Pipelined`` loop, and GEMMs with
ragged M, N, K over a ``T.Pipelined`` K loop of 1 to 3 stages (``numeric_tiles``) — and runs
each on every target from the same random inputs (never zero), outputs poisoned with NaN. Each
target's output is compared with a float64 reference computed in torch by the contract and with
the interpreter's, at these bounds (``ulp_t(r)``: the spacing of type ``t``'s values at ``|r|``,
subnormals included; ``u = 2**-24``, float32's unit roundoff):

* elementwise chains of ``+ - * /``, ``min``/``max``, ``abs``, negation, ``//``, ``%``, float
  constants and casts (FP8 round trips included): **bit-exact**, on every target, to the
  reference that rounds each step once to its type;
* a chain ending in a math function (``exp``, ``exp2``, ``log``, ``sqrt``) computed in type
  ``t``: within ``1 ulp_t`` of float64's function of the same argument for 16-bit ``t`` and
  ``MATH_ULPS`` float32 ulps for float32, plus ``1 ulp_out`` where the store narrows it; two
  targets within twice that;
* ``T.reduce_max``: bit-exact; ``T.reduce_sum`` of ``n`` values ``a``: within
  ``n * u * sum|a| + 1 ulp_acc + 1 ulp_out`` of the exact sum (float32 accumulation in any
  order, one rounding to the reduction's type, one to the output's);
* GEMMs: within ``K * u * (|A| @ |B|) + 1 ulp_out`` of the exact product (16-bit products are
  exact in float32; float32 accumulation in any order; one rounding into the output);
  reductions and GEMMs on two targets within twice their bound.

Profiles: CI runs ``TILEWS_FUZZ_NUMERIC_EXAMPLES`` (default 10) programs of each family on
every target, the same ones each time (derandomized; about 5 s a family on one core). The long
run draws fresh programs from a seed, e.g. ``TILEWS_FUZZ_NUMERIC_EXAMPLES=400 TILEWS_FUZZ_SEED=7
pytest tests/test_fuzz_numeric.py -n 2 -p no:cacheprovider --hypothesis-show-statistics`` (about
0.7 s a program on one core, its three targets included). A failure prints the program's
source.
"""
from __future__ import annotations

import collections
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilews

from .fuzzing import load_factory, metal_runs_here, profile
from .helpers import poisoned
from .numeric_chains import TORCH, chain_inputs, chain_reference, chain_source, chains
from .numeric_tiles import (
    gemm_inputs,
    gemm_reference,
    gemm_source,
    gemms,
    reduction_inputs,
    reduction_reference,
    reduction_source,
    reductions,
)

EXAMPLES = int(os.environ.get("TILEWS_FUZZ_NUMERIC_EXAMPLES", "10"))
SEED = int(os.environ["TILEWS_FUZZ_SEED"]) if "TILEWS_FUZZ_SEED" in os.environ else None
TARGETS = ("interpret", "triton") + (("metal",) if metal_runs_here() else ())
MATH_ULPS = 2
MANTISSA = {"float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}
U = 2.0 ** -24


def ulp(ref: torch.Tensor, t: str) -> torch.Tensor:
    """The spacing of ``t``'s values at ``|ref|`` (zero for int32: exact)."""
    if t not in MANTISSA:
        return torch.zeros_like(ref)
    bits, emin = MANTISSA[t]
    exp = torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** emin))).clamp_min(emin)
    return torch.exp2(exp - bits)


def launch(target: str, source: str, inputs: dict, out: str, shape) -> torch.Tensor:
    """The output of ``source``'s kernel on ``target``, poisoned before the launch."""
    o = poisoned(*shape, dtype=TORCH[out])
    tilews.jit(target=target)(load_factory(source))()(*inputs.values(), o)
    return o


def compare(source: str, inputs: dict, out: str, ref: torch.Tensor, bound) -> None:
    """Every target within ``bound`` (a tensor like ``ref``; zero: bit-exact) of the reference,
    and within twice it of the interpreter."""
    results = {t: launch(t, source, inputs, out, ref.shape).double() for t in TARGETS}
    for target, got in results.items():
        where = f"on {target}\n{source}"
        assert not got.isnan().any(), f"{int(got.isnan().sum())} elements not written {where}"
        err = (got - ref).abs()
        bad = err > bound
        assert not bad.any(), (f"{int(bad.sum())} of {ref.numel()} beyond the bound, e.g. "
                               f"{got[bad][:4].tolist()} for {ref[bad][:4].tolist()} {where}")
        diff = (got - results["interpret"]).abs() > 2 * bound
        assert not diff.any(), (f"{int(diff.sum())} differ from the interpreter's, e.g. "
                                f"{got[diff][:4].tolist()} for "
                                f"{results['interpret'][diff][:4].tolist()} {where}")


# each family's bound (the module docstring's)

def chain_bound(c, ref: torch.Tensor, _) -> torch.Tensor:
    if c.math_type is None:
        return torch.zeros_like(ref)
    t = c.math_type
    bound = ulp(ref, t) * (1 if t != "float32" else MATH_ULPS)
    return bound + ulp(ref, c.out) if MANTISSA[c.out][0] < MANTISSA[t][0] else bound


def reduction_bound(r, ref: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if r.kind == "max":
        return torch.zeros_like(ref)
    return r.terms * U * scale + ulp(ref, r.acc) + ulp(ref, r.out)


def gemm_bound(g, ref: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return g.K * U * scale + ulp(ref, g.out)


Family = collections.namedtuple("Family", "programs inputs reference bound source")
FAMILIES = {
    "chains": Family(chains(), chain_inputs, chain_reference, chain_bound, chain_source),
    "reductions": Family(reductions(), reduction_inputs, reduction_reference, reduction_bound,
                         reduction_source),
    "gemms": Family(gemms(), gemm_inputs, gemm_reference, gemm_bound, gemm_source)}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@profile(EXAMPLES, SEED)
@given(data=st.data())
def test_targets_agree_within_the_contract(family, data):
    f = FAMILIES[family]
    p = data.draw(f.programs, label=family)
    inputs = f.inputs(p)
    ref, scale = f.reference(p, inputs)
    compare(f.source(p), inputs, p.out, ref, f.bound(p, ref, scale))
