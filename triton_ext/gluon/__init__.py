"""The Gluon backend: warp-specialized Hopper (sm_90a) kernels.

``build(kernel, target)`` lowers a frontend kernel for ``HOPPER``, emits its Gluon source and
compiles it (compile-only, in a child process: ``.asm`` works without a GPU);
``GluonProgram.launch(args)`` runs it on an H100/H200. ``emit`` alone needs no Triton.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.passes import lower
from tilews.lowering.target import Target

from .emit import emit
from .launch import GluonProgram

__all__ = ["GluonProgram", "build", "emit"]


def build(kernel: ir.Kernel, target: Target) -> GluonProgram:
    """Lower ``kernel`` for ``target`` (Hopper), emit it and compile it for sm_90a."""
    lowered = lower(kernel, target)
    return GluonProgram(emit(lowered), lowered.name, lowered)
