"""What a benchmarked workload provides, and the registry of workloads.

A workload (GEMM now; FP8 GEMM and attention later) knows its shapes, inputs, FLOP count and exact
reference, the tilews variants to build per target, and the references to compare against. The
runner (``tilews.bench.runner``) does the same for every workload: check, time, compare. Adding
FP8 means one module like ``tilews.bench.gemm`` (references ``torch._scaled_mm`` rowwise and
tensorwise) and its entry in ``WORKLOADS``; attention adds SDPA with the cuDNN and flash backends.

``variants`` and ``references`` are plain lists so a test can add a deliberately wrong kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch

from .machine import Machine
from .shapes import Shape

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}   # --dtype

# A built kernel: fn(*inputs, out) writes its result into ``out``.
KernelFn = Callable[..., object]


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, dt in DTYPES.items() if dt == dtype)


@dataclass(frozen=True)
class Case:
    """One shape of one workload on one machine."""
    shape: Shape
    dtype: torch.dtype
    machine: Machine


@dataclass(frozen=True)
class Variant:
    """A tilews kernel configuration; ``build(case, target)`` compiles it for a tilews target."""
    name: str
    build: Callable[[Case, str], KernelFn]


@dataclass(frozen=True)
class Reference:
    """What tilews is compared against. ``runs_on(machine)`` names what executes it ("cuBLAS");
    ``unavailable(machine)`` says why it cannot run here, or None."""
    name: str
    build: Callable[[Case], KernelFn]
    runs_on: Callable[[Machine], str]
    interpreted: Callable[[Machine], bool] = lambda m: not m.gpu
    unavailable: Callable[[Machine], Optional[str]] = lambda m: None


@dataclass
class Workload:
    name: str
    dims: str                                        # dimension names, "MNK"
    presets: dict[str, tuple[Shape, ...]]
    default_preset: Callable[[Machine, bool], str]   # (machine, quick) -> preset name
    flops: Callable[[Shape], float]
    make_inputs: Callable[[Case, torch.Generator], tuple[torch.Tensor, ...]]
    make_output: Callable[[Case], torch.Tensor]
    reference: Callable[..., torch.Tensor]           # exact (float64) result from the inputs
    tolerance: float                                 # on ||out - ref|| / ||ref||
    variants: list[Variant] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)


@dataclass(frozen=True)
class Pending:
    """A workload tilews has no kernels for yet: the bench says so and exits 0."""
    name: str
    message: str


def registry() -> dict[str, Union[Workload, Pending]]:
    from . import gemm
    return {"gemm": gemm.WORKLOAD,
            "fp8": Pending("fp8", "tilews has no FP8 GEMM kernels yet (T.fp8_scaled_matmul is not "
                                  "implemented); the FP8 bench will compare against torch._scaled_mm "
                                  "with rowwise and tensorwise scales once they exist."),
            "attention": Pending("attention", "tilews has no attention kernels yet; the attention "
                                              "bench will compare against SDPA with the cuDNN and "
                                              "flash backends once they exist.")}
