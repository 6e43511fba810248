"""``tilews-bench launch``: what one cached call of a tiny kernel costs the host, in microseconds.

The kernels, all computing C = A @ B on the same 64x64x64 operands and each returning a new C
(allocated per call, as a user's call allocates it):

* ``tilews kernel``: ``examples.gemm.matmul`` built once for this machine's best target
  (``target="auto"``), with ``out_idx``, then called as ``kernel(a, b)``;
* ``raw triton launch``: the plain Triton ``tl.dot`` kernel of ``tilews.bench.baselines``
  launched directly, ``kernel[grid](...)`` on a fixed one-block grid;
* ``torch.matmul``;
* ``tilews.ops.matmul``: the ready-made op (its schedule from the disk cache or its heuristic);
* ``tilews.ops.fp8_scaled_mm`` and ``torch._scaled_mm``: the same product in FP8, A and B rounded
  to float8_e4m3fn (B column-major, as torch passes a weight), per-row and per-column float32
  scales of 1, C in the run's dtype; their check's exact product is that of the rounded operands.

Each is built and checked once against the float64 product (tolerance 1e-2 on the relative
error); then every round times each kernel once, in an order rotating from round to round: a
synchronize, then ``calls`` back-to-back calls timed by the wall clock (``time.perf_counter``)
until the last call returns, divided by ``calls``; a synchronize after the timing. ``calls`` stays
well below the GPU's queue of pending launches (about a thousand), so no call waits for the GPU:
this is the host's cost per call, whatever each tiny kernel's time on the GPU (a one-block
warp-specialized kernel and cuBLAS's differ). The reported microseconds are the median over the
rounds. ``minus raw triton`` is a row's median minus the raw launch's: the issue's target is
``tilews`` <= raw triton + 5 us. Without a GPU the kernels run in tilews's interpreter, Triton's
CPU interpreter and torch's CPU matmul: those are INTERPRETER TIMINGS, not launch costs.

Exit code 0 when every kernel that can run here is correct, 1 when one is wrong or raised; a
kernel that cannot run here (no triton, no ``tilews.ops.matmul``) is reported, not failed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Optional

import torch

from tilews.testing import rel_err

from . import machine as machines
from .console import _check as check_text, _plain as plain_table   # the bench's table cells
from .machine import Machine, triton_unavailable
from .workload import DTYPES, Unavailable

SCHEMA = 1
SIZE = 64                          # M = N = K
BLOCK = dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128)   # tilews's tiny tiles
TOLERANCE = 1e-2                   # on ||C - exact|| / ||exact||
CALLS = {True: 200, False: 5}     # default --calls on a GPU / without one (interpreters are slow)
ROUNDS = {True: 7, False: 3}       # default --rounds
RAW = "raw triton launch"          # the row the others are compared with
FAILED = ("fail", "error")

Call = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _same(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a, b


@dataclass(frozen=True)
class Contender:
    """A kernel timed here: ``build(machine, a)`` returns ``call(a, b) -> C`` and what runs it,
    or raises ``Unavailable``; ``operands`` makes what it multiplies from the run's A and B."""
    name: str
    build: Callable[[Machine, torch.Tensor], tuple[Call, str]]
    operands: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = _same


@dataclass
class LaunchRow:
    impl: str
    runs_on: str = ""
    status: str = "ok"              # "ok" | "fail" | "error" | "unavailable"
    message: str = ""
    rel_err: Optional[float] = None
    build_s: Optional[float] = None  # the build and the first (checked) call: compiles happen there
    us_runs: list[float] = field(default_factory=list)   # microseconds per call, one per round

    @property
    def us(self) -> Optional[float]:
        return statistics.median(self.us_runs) if self.us_runs else None

    @property
    def spread_pct(self) -> Optional[float]:
        if len(self.us_runs) < 2:
            return None
        return (max(self.us_runs) - min(self.us_runs)) / self.us * 100


# ---- the kernels ---------------------------------------------------------------------------------

def _tilews_kernel(machine: Machine, a: torch.Tensor) -> tuple[Call, str]:
    from tilews.lowering.dtypes import from_torch

    from .gemm import example_gemm
    kernel = example_gemm().matmul(SIZE, SIZE, SIZE, dtype=from_torch(a.dtype), **BLOCK)
    return kernel, f"tilews {kernel.target}"


def _raw_triton(machine: Machine, a: torch.Tensor) -> tuple[Call, str]:
    why = triton_unavailable(machine)
    if why:
        raise Unavailable(why)
    from .baselines import INTERPRETED, _matmul_kernel
    grid = (1,)

    def call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = torch.empty((SIZE, SIZE), dtype=a.dtype, device=a.device)
        _matmul_kernel[grid](a, b, c, SIZE, SIZE, SIZE, a.stride(0), a.stride(1), b.stride(0),
                             b.stride(1), c.stride(0), c.stride(1), BLOCK_M=SIZE, BLOCK_N=SIZE,
                             BLOCK_K=SIZE, GROUP_M=1, UPCAST=INTERPRETED, num_warps=4)
        return c
    return call, "triton" if machine.gpu else "triton CPU interpreter"


def _torch_matmul(machine: Machine, a: torch.Tensor) -> tuple[Call, str]:
    return torch.matmul, "cuBLAS" if machine.gpu else "torch CPU"


def _ops_matmul(machine: Machine, a: torch.Tensor) -> tuple[Call, str]:
    try:
        from tilews.ops import matmul
    except ImportError as e:
        raise Unavailable(f"this tilews has no tilews.ops.matmul ({e})") from None
    from .gemm import ops_target
    return matmul, f"tilews {ops_target(machine)}"


def _fp8(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B rounded to float8_e4m3fn, B column-major (``w.t()`` of a contiguous w)."""
    return a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()


def _unit_scales(a: torch.Tensor):
    """Per-row scales of A and per-column scales of B, all 1."""
    return (torch.ones(SIZE, 1, device=a.device), torch.ones(1, SIZE, device=a.device))


def _ops_fp8(machine: Machine, a: torch.Tensor) -> tuple[Call, str]:
    from tilews.ops import fp8_scaled_mm

    from .gemm import ops_target
    (scale_a, scale_b), out = _unit_scales(a), a.dtype
    return (lambda a, b: fp8_scaled_mm(a, b, scale_a, scale_b, out_dtype=out),
            f"tilews {ops_target(machine)}")


def _torch_scaled_mm(machine: Machine, a: torch.Tensor) -> tuple[Call, str]:
    (scale_a, scale_b), out = _unit_scales(a), a.dtype

    def call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out)
    try:
        call(*_fp8(a, a))
    except (RuntimeError, NotImplementedError) as e:      # how torch says "not here"
        raise Unavailable(f"torch._scaled_mm does not run here: {' '.join(str(e).split())[:200]}") from None
    return call, "cuBLAS" if machine.gpu else "torch CPU"


CONTENDERS = [Contender("tilews kernel", _tilews_kernel), Contender(RAW, _raw_triton),
              Contender("torch.matmul", _torch_matmul), Contender("tilews.ops.matmul", _ops_matmul),
              Contender("tilews.ops.fp8_scaled_mm", _ops_fp8, _fp8),
              Contender("torch._scaled_mm", _torch_scaled_mm, _fp8)]


# ---- measuring -----------------------------------------------------------------------------------

def run(machine: Machine, dtype: torch.dtype, calls: int, rounds: int) -> list[LaunchRow]:
    """Build and check every contender, then time the correct ones in ``rounds`` rotating rounds."""
    gen = torch.Generator(device=machine.device).manual_seed(0)
    a, b = (torch.randn(SIZE, SIZE, generator=gen, device=machine.device).to(dtype) for _ in range(2))
    rows, calls_of = [], {}
    for contender in CONTENDERS:
        row = LaunchRow(contender.name)
        operands = contender.operands(a, b)
        fn = _check(row, contender, machine, a, operands)
        if fn is not None:
            calls_of[row.impl] = fn, operands
        rows.append(row)
    timed = [r for r in rows if r.impl in calls_of]
    for n in range(rounds if timed else 0):
        for row in timed[n % len(timed):] + timed[:n % len(timed)]:
            fn, operands = calls_of[row.impl]
            row.us_runs.append(per_call_us(fn, *operands, calls, machine))
    return rows


def _check(row: LaunchRow, contender: Contender, machine: Machine, a: torch.Tensor,
           operands: tuple[torch.Tensor, torch.Tensor]) -> Optional[Call]:
    """Build it (for the run's A, ``a``) and call it once on its ``operands``; the call if it ran
    and matched their float64 product, else None (the row says why)."""
    exact = operands[0].double() @ operands[1].double()
    try:
        t0 = time.perf_counter()
        fn, row.runs_on = contender.build(machine, a)
        result = fn(*operands)
        _sync(machine)
        row.build_s = time.perf_counter() - t0
    except Unavailable as e:
        row.status, row.message = "unavailable", str(e)
        return None
    except Exception as e:  # noqa: BLE001 - a kernel that raises is a failing row, not a crash
        row.status, row.message = "error", f"{type(e).__name__}: {e}"
        return None
    try:
        row.rel_err = rel_err(result, exact)
    except AssertionError as e:   # NaN in the result
        row.status, row.message = "fail", str(e)
        return None
    if not row.rel_err <= TOLERANCE:
        row.status, row.message = "fail", f"rel err {row.rel_err:.3e} exceeds the tolerance {TOLERANCE:.0e}"
        return None
    return fn


def per_call_us(fn: Call, a: torch.Tensor, b: torch.Tensor, calls: int, machine: Machine) -> float:
    """Host microseconds per call: ``calls`` back-to-back calls after a synchronize, timed until
    the last one returns (the GPU's queue absorbs them: none waits for the GPU)."""
    _sync(machine)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(a, b)
    elapsed = time.perf_counter() - t0
    _sync(machine)
    return elapsed / calls * 1e6


def _sync(machine: Machine) -> None:
    if machine.gpu:
        torch.cuda.synchronize()


# ---- the report ----------------------------------------------------------------------------------

def minus_raw(rows: list[LaunchRow]) -> dict[str, float]:
    """Each timed row's median minus the raw Triton launch's (empty when that one did not run)."""
    raw = next((r.us for r in rows if r.impl == RAW and r.us is not None), None)
    if raw is None:
        return {}
    return {r.impl: r.us - raw for r in rows if r.us is not None and r.impl != RAW}


def timing_method(machine: Machine, calls: int, rounds: int) -> str:
    what = (f"{calls} back-to-back calls after a synchronize, host wall clock per call until the "
            f"last returns; median of "
            f"{rounds} rounds, each timing every kernel once in a rotating order")
    return what if machine.gpu else what + " (interpreter timings: not launch costs)"


def failures(rows: list[LaunchRow]) -> int:
    return sum(r.status in FAILED for r in rows)


def as_json(rows: list[LaunchRow], machine: Machine, dtype: str, calls: int, rounds: int) -> dict:
    failed = failures(rows)
    extra = minus_raw(rows)
    return {"schema": SCHEMA, "command": "launch",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": machine.as_json(), "versions": machines.versions(), "dtype": dtype,
            "shape": [SIZE, SIZE, SIZE],
            "timing": {"method": timing_method(machine, calls, rounds), "calls": calls, "rounds": rounds,
                       "interpreter_timings": not machine.gpu},
            "rows": [{"impl": r.impl, "runs_on": r.runs_on, "status": r.status, "message": r.message,
                      "rel_err": r.rel_err, "build_s": r.build_s, "us_runs": r.us_runs, "us": r.us,
                      "spread_pct": r.spread_pct, "minus_raw_triton_us": extra.get(r.impl)}
                     for r in rows],
            "failures": failed, "exit_code": 1 if failed else 0}


def _print(rows: list[LaunchRow], machine: Machine, dtype: str, calls: int, rounds: int) -> None:
    for r in rows:
        if r.status != "ok":
            print(f"{r.status.upper()} {r.impl}: {r.message}")
    if not machine.gpu:
        print("No CUDA GPU here: the kernels run in tilews's interpreter, Triton's CPU interpreter and "
              "torch on the CPU. These are INTERPRETER TIMINGS, NOT launch costs, and not comparable "
              "with each other.")
    extra = minus_raw(rows)
    cells = [[r.impl, r.runs_on or "-", check_text(r), _num(r.us), "" if r.spread_pct is None
              else f"{r.spread_pct:.1f}%", "-" if r.impl not in extra else f"{extra[r.impl]:+.1f}"]
             for r in rows]
    title = (f"tilews-bench launch · {SIZE}x{SIZE}x{SIZE} {dtype} · {machine.name}"
             + ("" if machine.gpu else " · INTERPRETER TIMINGS (not launch costs)"))
    failed = failures(rows)
    verdict = f"{failed} row(s) FAILED: exit code 1" if failed else "all rows correct"
    plain_table(title, ["kernel", "runs on", "check", "us per call", "±", "minus raw triton (us)"], cells,
                f"{timing_method(machine, calls, rounds)}. {verdict}.")


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"


# ---- the command ---------------------------------------------------------------------------------

def add_options(parser: argparse.ArgumentParser, positive: Callable[[str], int]) -> None:
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16",
                        help="the operands' and result's dtype")
    parser.add_argument("--calls", type=positive, metavar="N",
                        help=f"back-to-back calls per timing (default: {CALLS[True]} on a GPU, "
                             f"{CALLS[False]} without one)")
    parser.add_argument("--rounds", type=positive, metavar="N",
                        help=f"interleaved timing rounds; the median is reported (default: {ROUNDS[True]} "
                             f"on a GPU, {ROUNDS[False]} without one)")
    parser.add_argument("--json", metavar="PATH", help="write every number, the device and versions")


def main(args: argparse.Namespace) -> int:
    machine = machines.detect()
    calls, rounds = args.calls or CALLS[machine.gpu], args.rounds or ROUNDS[machine.gpu]
    rows = run(machine, DTYPES[args.dtype], calls, rounds)
    data = as_json(rows, machine, args.dtype, calls, rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    _print(rows, machine, args.dtype, calls, rounds)
    return data["exit_code"]
