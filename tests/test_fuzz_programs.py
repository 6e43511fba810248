"""Differential fuzzing: random varlen-style tile programs on ``interpret``, ``triton`` and ``metal``.

hypothesis draws a small program from a grammar (``Program``), which is rendered as the source
of a factory-style ``@T.prim_func`` (written to a module file: kernels need their source) and
run on each target from the same random inputs (never zeros; outputs poisoned with NaN, except
the ``T.atomic_add`` totals, which start at zero). Each target's outputs must match the
interpreter's: NaN (never written) in the same places, and elsewhere |target - interpret| <=
``TOL`` * (1 + max |interpret|) per output. A ``CompileError`` on a program the generator calls
supported is a failure, never assumed away.

The grammar (the shapes of TileLang's varlen attention and decoding kernels):

* a grid of (row blocks, sequences); each block finds its sequence's rows through a runtime bound,
  loaded (``cu_seqlens[b]``, ``cu_seqlens[b + 1] - cu_seqlens[b]``) or a scalar parameter;
* a global -> shared or fragment copy of a tile that may run past its sequence and the buffer;
* ``T.Parallel`` element math, guarded by the bound (``T.if_then_else(bx * BM + i < n, ...)`` and
  ``if`` statements inside the loop, on loop variables or on scalars only), element reads of other
  on-chip buffers and of the global input at computed (reversed) rows;
* reductions (max, sum) along either dim, broadcast back; a small gemm against a weight tile;
* stores: element stores of the valid rows (in order or reversed), a tile copy to a padded output,
  a part of the tile (``acc[:k, :]``), row statistics, one scalar per block under ``if i == 0``
  (a scalar address under a block mask), and a ``T.atomic_add`` of the valid elements.

Features a backend does not support yet are generated for it only once they leave ``PENDING``
(removed as they land). Today every target takes every feature: ``odd_extents`` (tile extents
that are not powers of two) and ``partial_slices`` (``acc[:k, :]`` in a copy) landed on
``triton`` with its padded tiles and on-chip ranges (issue 38).

Profiles: CI runs the same ``TILEWS_FUZZ_EXAMPLES`` (default 40) programs per target each time
(derandomized). By hand, more and fresh ones, e.g. ``TILEWS_FUZZ_EXAMPLES=500 TILEWS_FUZZ_SEED=7
pytest tests/test_fuzz_programs.py -n 1`` (about 20 s per 100 programs per target on one
core); ``TILEWS_FUZZ_PENDING=`` (set empty) also generates the pending features everywhere, to see
how far a backend has come (or ``TILEWS_FUZZ_PENDING=partial_slices`` to keep only that one out).
A failure prints the program's source.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import textwrap

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilews

from .fuzzing import load_factory, metal_runs_here, profile
from .helpers import poisoned, randn

TARGETS = ("triton", "metal")

# features each target does not support yet: never generated for it (turn on after they land)
PENDING: dict[str, set[str]] = {"triton": set(), "metal": set()}
if "TILEWS_FUZZ_PENDING" in os.environ:
    PENDING = {t: set(os.environ["TILEWS_FUZZ_PENDING"].split(",")) - {""} for t in TARGETS}

EXAMPLES = int(os.environ.get("TILEWS_FUZZ_EXAMPLES", "40"))
SEED = int(os.environ["TILEWS_FUZZ_SEED"]) if "TILEWS_FUZZ_SEED" in os.environ else None
TOL = 2e-4
POW2 = (8, 16, 32)
ODD = (12, 20, 24)

# element math on the tile: a function of the element `v` (the tile's element) and `x` (the
# copied input's element), each keeping values moderate
UNARY = ("{v} * 0.5 + 0.25", "T.exp({v} * 0.25)", "T.max({v}, -0.5)", "T.abs({v}) - 0.5",
         "T.sqrt(T.abs({v}) + 1.0)", "{v} * {x}", "{v} - {x} * 0.5", "T.min({v}, {x})")


@dataclasses.dataclass(frozen=True)
class Program:
    bound: str              # "loaded": cu_seqlens; "param": a scalar parameter, fixed-stride rows
    batch: int
    lens: tuple[int, ...]   # rows per sequence
    BM: int                 # rows per block
    C: int                  # columns
    staging: str            # "shared" | "fragment": where the input tile is copied
    dtype: str              # "float32" | "float16": the input, its tile and the gemm operands
    steps: tuple            # ("math" | "guard" | "if" | "scalar_if" | "gather", k) |
                            # ("reduce", kind, dim) | ("gemm",)
    stores: tuple[str, ...]
    part: int               # rows of the partial copy
    seed: int

    @property
    def seq(self) -> int:
        return max(self.lens)

    @property
    def blocks(self) -> int:
        return -(-self.seq // self.BM)


def programs(target: str):
    pending = PENDING.get(target, set())
    extents = st.sampled_from(POW2 + (() if "odd_extents" in pending else ODD))

    @st.composite
    def build(draw):
        BM, C = draw(extents), draw(extents)
        batch = draw(st.integers(1, 3))
        lens = tuple(draw(st.lists(st.integers(0, 2 * BM + 5), min_size=batch, max_size=batch)))
        if max(lens) == 0:
            lens = (1,) + lens[1:]
        gemm_ok = BM >= 16 and C >= 16 and BM in POW2 and C in POW2
        step = st.one_of(
            st.tuples(st.just("math"), st.integers(0, len(UNARY) - 1)),
            st.tuples(st.just("guard"), st.integers(0, len(UNARY) - 1)),
            st.tuples(st.just("if"), st.integers(0, len(UNARY) - 1)),
            st.tuples(st.just("scalar_if"), st.integers(0, len(UNARY) - 1)),
            st.tuples(st.just("gather"), st.integers(0, len(UNARY) - 1)),
            st.tuples(st.just("reduce"), st.sampled_from(("max", "sum")), st.integers(0, 1)),
            *([st.just(("gemm",))] if gemm_ok else []))
        steps = tuple(draw(st.lists(step, min_size=1, max_size=4)))
        kinds = ["rows", "reversed", "tile", "scalar", "atomic"]
        if any(s[0] == "reduce" for s in steps):
            kinds.append("stat")
        if "partial_slices" not in pending:
            kinds.append("part")
        stores = tuple(draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3, unique=True)))
        return Program(bound=draw(st.sampled_from(("loaded", "param"))), batch=batch, lens=lens,
                       BM=BM, C=C, staging=draw(st.sampled_from(("shared", "fragment"))),
                       dtype=draw(st.sampled_from(("float32", "float16"))),
                       steps=steps, stores=stores, part=draw(st.integers(1, BM - 1)),
                       seed=draw(st.integers(0, 2**16)))
    return build()


# ----------------------------------------------------------------------------------------------
# rendering a program as a module's source


def outputs(p: Program) -> dict[str, tuple[int, ...]]:
    """Each store's output tensor and shape (rows: the concatenated sequences)."""
    rows, padded = sum(p.lens) if p.bound == "loaded" else p.batch * p.seq, p.blocks * p.BM
    reduced = _reduced(p)
    shapes = {"rows": (rows, p.C), "reversed": (rows, p.C), "tile": (p.batch, padded, p.C),
              "part": (p.batch, padded, p.C), "scalar": (p.batch, p.blocks), "atomic": (p.batch,),
              "stat": (p.batch, padded) if reduced == 1 else (p.batch, p.blocks, p.C)}
    return {f"O_{s}": shapes[s] for s in p.stores}


def _reduced(p: Program):
    """The dim of the last reduction (its result is what a "stat" store writes)."""
    dims = [s[2] for s in p.steps if s[0] == "reduce"]
    return dims[-1] if dims else None


def source(p: Program) -> str:
    BM, C = p.BM, p.C
    rows = sum(p.lens) if p.bound == "loaded" else p.batch * p.seq
    params = [f"X: T.Tensor(({rows}, {C}), T.{p.dtype})"]
    if p.bound == "loaded":
        params.append(f"cu: T.Tensor(({p.batch + 1},), T.int32)")
    if any(s[0] == "gemm" for s in p.steps):
        params.append(f"W: T.Tensor(({C}, {C}), T.{p.dtype})")
    params += [f"{name}: T.Tensor({shape}, T.float32)" for name, shape in outputs(p).items()]
    if p.bound == "param":
        params.append("m: T.int32")
    body = []
    add = body.append
    if p.bound == "loaded":
        add("start = cu[bz]")
        add("n = cu[bz + 1] - start")
    else:
        add(f"start = bz * {p.seq}")
        add("n = m")
    add(f"base = start + bx * {BM}")
    add(f"x_s = T.alloc_{p.staging}(({BM}, {C}), T.{p.dtype})")
    add(f"acc = T.alloc_fragment(({BM}, {C}), T.float32)")
    add(f"red_r = T.alloc_fragment(({BM},), T.float32)")
    add(f"red_c = T.alloc_fragment(({C},), T.float32)")
    add(f"T.copy(X[base:base + {BM}, 0:{C}], x_s)")
    add(f"for i, j in T.Parallel({BM}, {C}):")
    add(f"    acc[i, j] = T.if_then_else(bx * {BM} + i < n, x_s[i, j], 0.0)")
    red = None
    for s in p.steps:
        if s[0] in ("math", "guard", "if", "scalar_if", "gather"):
            f = UNARY[s[1]].format(v="acc[i, j]", x="x_s[i, j]")
            add(f"for i, j in T.Parallel({BM}, {C}):")
            if s[0] == "math":
                add(f"    acc[i, j] = {f}")
            elif s[0] == "guard":
                add(f"    acc[i, j] = T.if_then_else(bx * {BM} + i < n and j < n + 1, {f}, acc[i, j] * 2.0)")
            elif s[0] == "if":
                add(f"    if bx * {BM} + i < n:")
                add(f"        acc[i, j] = {f}")
                add("    else:")
                add("        acc[i, j] = -1.0")
            elif s[0] == "scalar_if":     # conditions that read no loop variable
                add(f"    if bx * {BM} + {BM // 2} < n:")
                add(f"        acc[i, j] = T.if_then_else(n > {BM // 3}, {f}, acc[i, j] + 1.0)")
            else:                         # a global read at a computed (reversed) row
                add(f"    acc[i, j] = {f} + T.if_then_else(bx * {BM} + ({BM - 1} - i) < n, "
                    f"X[base + ({BM - 1} - i), j], 0.5)")
        elif s[0] == "reduce":
            _, kind, dim = s
            red = "red_r" if dim == 1 else "red_c"
            add(f"T.reduce_{kind}(acc, {red}, dim={dim})")
            r = f"{red}[i]" if dim == 1 else f"{red}[j]"
            add(f"for i, j in T.Parallel({BM}, {C}):")
            add(f"    acc[i, j] = acc[i, j] - {r} * 0.5" if kind == "max" else
                f"    acc[i, j] = acc[i, j] / (T.abs({r}) + 1.0)")
        else:   # gemm: acc = acc @ W (through shared memory)
            add(f"a_s = T.alloc_shared(({BM}, {C}), T.{p.dtype})")
            add(f"w_s = T.alloc_shared(({C}, {C}), T.{p.dtype})")
            add("T.copy(acc, a_s)")
            add(f"T.copy(W[0:{C}, 0:{C}], w_s)")
            add("T.gemm(a_s, w_s, acc, clear_accum=True)")
    guard = f"bx * {BM} + i < n"
    for kind in p.stores:
        if kind == "rows":
            add(f"for i, j in T.Parallel({BM}, {C}):")
            add(f"    if {guard}:")
            add("        O_rows[base + i, j] = acc[i, j]")
        elif kind == "reversed":
            add(f"for i, j in T.Parallel({BM}, {C}):")
            add(f"    if bx * {BM} + ({BM - 1} - i) < n:")
            add(f"        O_reversed[base + ({BM - 1} - i), j] = acc[i, j]")
        elif kind == "tile":
            add(f"T.copy(acc, O_tile[bz, bx * {BM}:bx * {BM} + {BM}, 0:{C}])")
        elif kind == "part":
            add(f"T.copy(acc[:{p.part}, :], O_part[bz, bx * {BM}:bx * {BM} + {p.part}, 0:{C}])")
        elif kind == "scalar":
            add(f"for i in T.Parallel({BM}):")
            add("    if i == 0:")
            add("        O_scalar[bz, bx] = acc[0, 0] + T.cast(n, T.float32)")
        elif kind == "atomic":
            add(f"for i, j in T.Parallel({BM}, {C}):")
            add(f"    if {guard}:")
            add("        T.atomic_add(O_atomic[bz], acc[i, j])")
        else:   # stat: the last reduction's result
            if _reduced(p) == 1:
                add(f"for i, j in T.Parallel({BM}, {C}):")
                add("    if j == 0:")
                add(f"        O_stat[bz, bx * {BM} + i] = {red}[i]")
            else:
                add(f"for j in T.Parallel({C}):")
                add(f"    O_stat[bz, bx, j] = {red}[j]")
    return "\n".join([
        '"""A program generated by tests/test_fuzz_programs.py."""',
        "import tilews.language as T", "", "",
        "def make():",
        "    @T.prim_func",
        f"    def main({', '.join(params)}):",
        f"        with T.Kernel({p.blocks}, {p.batch}, threads=128) as (bx, bz):",
        textwrap.indent("\n".join(body), " " * 12),
        "    return main", ""])


# ----------------------------------------------------------------------------------------------
# running and comparing

def run(p: Program, target: str) -> dict[str, torch.Tensor]:
    kernel = tilews.jit(target=target)(load_factory(source(p)))()
    rows = sum(p.lens) if p.bound == "loaded" else p.batch * p.seq
    dtype = getattr(torch, p.dtype)
    args = [(randn(rows, p.C, seed=p.seed) * 0.5 + 0.1).to(dtype)]
    if p.bound == "loaded":
        args.append(torch.tensor([0, *itertools.accumulate(p.lens)], dtype=torch.int32))
    if any(s[0] == "gemm" for s in p.steps):
        args.append((randn(p.C, p.C, seed=p.seed + 1) / p.C ** 0.5).to(dtype))
    outs = {name: torch.zeros(shape) if name == "O_atomic" else poisoned(*shape)
            for name, shape in outputs(p).items()}
    args += list(outs.values())
    if p.bound == "param":
        args.append(min(p.lens))
    kernel(*args)
    return outs


def check(p: Program, target: str) -> None:
    expected, actual = run(p, "interpret"), run(p, target)
    for name, want in expected.items():
        got = actual[name]
        where = f"{name} on {target}\n{source(p)}"
        assert torch.equal(got.isnan(), want.isnan()), f"written elements differ: {where}"
        scale = 1 + want.nan_to_num().abs().max().item()
        err = (got - want).nan_to_num().abs().max().item()
        assert err <= TOL * scale, f"max error {err} (allowed {TOL * scale}): {where}"


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_differential(target):
    if target == "metal" and not metal_runs_here():
        pytest.skip("needs a C++17 compiler")

    @profile(EXAMPLES, SEED)
    @given(programs(target))
    def differential(p):
        check(p, target)

    differential()
