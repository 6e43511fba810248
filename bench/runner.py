"""Run one workload over its shapes: build every kernel, check it against the exact reference
(output poisoned with NaN first), then time it, and compare.

Per shape the order is: every check, then ``rounds`` interleaved timing rounds. Each round times
every kernel once (each timing itself a median of many runs), starting one kernel later than the
round before, so no kernel is always timed first or last. A ratio is the median over the rounds of
the same-round ratio: a timing that is slow in one round (a busy shared GPU) moves that round's
ratio only, and the min..max of the per-round ratios shows how much the rounds disagreed.

A kernel's scope (SDPA's backend choice) is entered around its build, its check and each of its
timings, never around each call. A kernel that cannot run a case (``Unavailable``) gets a row
saying so, untimed, and is no failure.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from tilews.testing import poison_, rel_err

from . import apple_gpu
from .machine import Machine, mps_unavailable, triton_unavailable
from .results import Row
from .shapes import shape_text
from .timing import median_ms, sets_needed
from .workload import Case, KernelFn, Scope, Unavailable, Variant, Workload, dtype_name

Advance = Callable[[str], None]   # progress: one step done, with what comes next


@dataclass(frozen=True)
class Impl:
    """One kernel the bench runs: a tilews variant on one target, or a reference."""
    name: str
    kind: str                    # "tilews" | "reference"
    target: str
    interpreted: bool
    build: Callable[[Case], KernelFn]
    scope: Scope = contextlib.nullcontext    # entered around its build, check and each timing


def plan(workload: Workload, targets: Sequence[str], machine: Machine,
         variants: Optional[Sequence[str]] = None) -> tuple[list[Impl], dict[str, str]]:
    """The kernels to run here, and why the others cannot run ("target hopper" -> reason);
    ``variants``: only the tilews variants whose name contains one of these words (None: all)."""
    impls: list[Impl] = []
    unavailable: dict[str, str] = {}
    for target in targets:
        why = target_unavailable(target, machine)
        if why:
            unavailable[f"target {target}"] = why
            continue
        for v in workload.variants:
            if variants is not None and not any(word in v.name for word in variants):
                continue
            why = v.unavailable(target, machine)
            if why:
                unavailable[f"{v.name} on target {target}"] = why
                continue
            impls.append(Impl(v.name, "tilews", target, _interpreted(target, machine),
                              _builder(v, target, machine)))
    for ref in workload.references:
        if ref.targets and not set(ref.targets) & set(targets):
            continue
        why = ref.unavailable(machine)
        if why:
            unavailable[f"reference {ref.name}"] = why
            continue
        impls.append(Impl(ref.name, "reference", ref.runs_on(machine), ref.interpreted(machine), ref.build,
                          ref.scope))
    return impls, unavailable


def target_unavailable(target: str, machine: Machine) -> str | None:
    from tilews import targets
    try:
        targets.resolve(target)
    except Exception as e:  # noqa: BLE001 - tilews says why (e.g. "not in this version")
        return str(e).splitlines()[0]
    if target == "hopper" and machine.capability != "9.0":
        return "needs an H100/H200 (sm_90) to run; without one tilews only compiles for it"
    return triton_unavailable(machine) if target == "triton" else None


def _builder(variant: Variant, target: str, machine: Machine) -> Callable[[Case], KernelFn]:
    """``variant`` built for ``target``; on a Mac, a metal kernel is given MPS copies of the bench's
    CPU tensors (tilews runs Metal kernels where their tensors are: elsewhere, the CPU harness)."""
    if target == "metal" and mps_unavailable(machine) is None:
        return lambda case: apple_gpu.on_mps(variant.build(case, target))
    return lambda case: variant.build(case, target)


def _interpreted(target: str, machine: Machine) -> bool:
    """Whether tilews kernels on ``target`` run on the CPU here: always on 'interpret'; Triton's
    without a CUDA GPU (its interpreter); Metal's without an Apple GPU (the CPU harness)."""
    if target == "metal":
        return mps_unavailable(machine) is not None
    return target == "interpret" or not machine.gpu


def steps(impls: Sequence[Impl], rounds: int) -> int:
    """Progress steps per shape: one check per kernel, then one timing per kernel and round."""
    return len(impls) * (1 + rounds)


def run_shape(workload: Workload, case: Case, impls: Sequence[Impl], quick: bool, rounds: int,
              advance: Advance) -> list[Row]:
    gen = torch.Generator(device=case.machine.device).manual_seed(0)
    first = (*workload.make_inputs(case, gen), workload.make_output(case))
    n_sets = sets_needed(sum(t.nbytes for t in first), case.machine.l2_bytes)
    sets = [first] + [(*workload.make_inputs(case, gen), workload.make_output(case))
                      for _ in range(n_sets - 1)]
    exact = workload.reference(case, *first[:-1])
    rows, fns = [], {}
    for impl in impls:
        row = Row(workload.name, case.shape, dtype_name(case.dtype), impl.name, impl.kind,
                  impl.target, impl.interpreted, workload.tolerance, input_sets=n_sets,
                  flops=workload.flops(case.shape))
        fn = _check(row, impl, case, first, exact)
        if fn is not None:
            fns[id(row)] = (fn, impl.scope)
        rows.append(row)
        advance(f"{shape_text(case.shape)} {impl.name} [{impl.target}]: checked")
    del exact
    for n in range(rounds if rows else 0):
        for row in rows[n % len(rows):] + rows[:n % len(rows)]:
            # a row that raised while timing is not timed again: ms_runs[i] stays round i
            if id(row) in fns and row.status != "error":
                _time(row, *fns[id(row)], sets, case, quick)
            advance(f"{shape_text(case.shape)} {row.impl} [{row.target}]: timed, round {n + 1}/{rounds}")
    _compare(rows)
    return rows


def _check(row: Row, impl: Impl, case: Case, inputs: tuple, exact: torch.Tensor) -> KernelFn | None:
    """Build and run once into a NaN-poisoned output (or take the tensor of the output's shape it
    returns); the built kernel, or None if it raised or cannot run this case. A built kernel's
    ``note`` attribute, if any, becomes the row's message."""
    *args, out = inputs
    try:
        with impl.scope():
            t0 = time.perf_counter()
            fn = impl.build(case)
            row.build_s = time.perf_counter() - t0
            row.message = getattr(fn, "note", "")    # what the kernel chose (a schedule)
            poison_(out)
            result = fn(*args, out)
            _sync(case)
    except Unavailable as e:   # not this shape or dtype: the row says so, and it is no failure
        row.status, row.message = "unavailable", str(e)
        return None
    except Exception as e:  # noqa: BLE001 - a kernel that raises is a failing row, not a crash
        row.status, row.message = "error", f"{type(e).__name__}: {e}"
        return None
    try:
        returned = isinstance(result, torch.Tensor) and result.shape == out.shape
        row.rel_err = rel_err(result if returned else out, exact)
    except AssertionError as e:   # NaN in the output: unwritten elements
        row.status, row.message = "fail", str(e)
        return fn
    if not row.rel_err <= row.tolerance:
        row.status = "fail"
        row.message = f"rel err {row.rel_err:.3e} exceeds the tolerance {row.tolerance:.0e}"
    return fn


def _time(row: Row, fn: KernelFn, scope: Scope, sets: list, case: Case, quick: bool) -> None:
    try:
        with scope():
            row.ms_runs.append(median_ms(fn, sets, case.machine.device, quick))
    except Exception as e:  # noqa: BLE001
        row.status, row.message = "error", f"while timing: {type(e).__name__}: {e}"


def _compare(rows: list[Row]) -> None:
    """TFLOP/s from the median ms; per reference, the ratio of each round both were timed in."""
    timed = [r for r in rows if r.ms]
    for row in timed:
        row.tflops = row.flops / row.ms / 1e9
        row.ratio_rounds = {ref.impl: [r_ms / ms for r_ms, ms in zip(ref.ms_runs, row.ms_runs)]
                            for ref in timed if ref.kind == "reference" and ref is not row}


def _sync(case: Case) -> None:
    if case.machine.gpu:
        torch.cuda.synchronize()
