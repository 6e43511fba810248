"""What a benchmarked workload provides (the registry of workloads is ``tilews.bench.workloads``).

A workload (GEMM, the GEMM with a fused epilogue, attention, the FP8 scaled GEMM) knows its
shapes, inputs, FLOP count and exact reference, the tilews variants to build per target, and the
references to compare against. The runner (``tilews.bench.runner``) does the same for every
workload: check, time, compare. Adding one means a module like ``tilews.bench.gemm`` and its
entry in ``workloads.registry()``; the workload modules import this one, never the reverse.

``variants`` and ``references`` are plain lists so a test can add a deliberately wrong kernel.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Optional

import torch

from .machine import Machine
from .shapes import Shape

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}   # --dtype

# A built kernel: fn(*inputs, out) writes its result into ``out``, or returns it as a tensor of
# ``out``'s shape (a reference with no out= form, like SDPA; ``out`` is then unused).
KernelFn = Callable[..., object]
Scope = Callable[[], ContextManager]   # entered around a kernel's build, check and each timing


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, dt in DTYPES.items() if dt == dtype)


class Unavailable(Exception):
    """Raised by a kernel's build or first call: it cannot run this case here (a backend that does
    not take this shape or dtype). The row says so and why; it is not a failure."""


@dataclass(frozen=True)
class Case:
    """One shape of one workload on one machine."""
    shape: Shape
    dtype: torch.dtype
    machine: Machine


@dataclass(frozen=True)
class Variant:
    """A tilews kernel configuration; ``build(case, target)`` compiles it for a tilews target.
    ``unavailable(target, machine)`` says why it does not run on that target here, or None (a
    ready-made op that compiles for the target it picks itself)."""
    name: str
    build: Callable[[Case, str], KernelFn]
    unavailable: Callable[[str, Machine], Optional[str]] = lambda target, machine: None


@dataclass(frozen=True)
class Reference:
    """What tilews is compared against. ``runs_on(machine)`` names what executes it ("cuBLAS");
    ``unavailable(machine)`` says why it cannot run here, or None; ``scope()`` is entered around
    its build, check and each timing (not each call): SDPA's backend choice; ``applies(shape)``
    says whether it runs on a shape at all (FP8's block-wise reference: block-scaled rows only);
    ``targets``: the tilews targets it is the baseline of, run only when one of them is (empty: in
    every run; mlx's matmul: with target metal)."""
    name: str
    build: Callable[[Case], KernelFn]
    runs_on: Callable[[Machine], str]
    interpreted: Callable[[Machine], bool] = lambda m: not m.gpu
    unavailable: Callable[[Machine], Optional[str]] = lambda m: None
    scope: Scope = contextlib.nullcontext
    applies: Callable[[Shape], bool] = lambda shape: True
    targets: tuple[str, ...] = ()


@dataclass
class Workload:
    name: str
    dims: str                                        # dimension names, "MNK"
    presets: dict[str, tuple[Shape, ...]]
    default_preset: Callable[[Machine, bool], str]   # (machine, quick) -> preset name
    flops: Callable[[Shape], float]
    make_inputs: Callable[[Case, torch.Generator], tuple[torch.Tensor, ...]]
    make_output: Callable[[Case], torch.Tensor]
    reference: Callable[..., torch.Tensor]           # reference(case, *inputs): the exact (float64) result
    tolerance: float                                 # on ||out - ref|| / ||ref||
    variants: list[Variant] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    modes: tuple[str, ...] = ()                      # what a shape ends with: ("causal", "noncausal")


@dataclass(frozen=True)
class Pending:
    """A workload tilews has no kernels for yet: the bench says so and exits 0."""
    name: str
    message: str


def standard_preset(machine: Machine, quick: bool) -> str:
    """The default preset every workload names so: 'cpu' without a GPU, else 'gpu-quick' with
    --quick and 'bench' without."""
    if not machine.gpu:
        return "cpu"
    return "gpu-quick" if quick else "bench"
