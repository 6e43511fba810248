"""The ``triton.language`` backend: any Triton target, and Triton's CPU interpreter.

``build(kernel, target)`` lowers a frontend kernel, emits its source and loads it;
``TlProgram.launch(args)`` runs it. ``emit`` alone needs no Triton (compile-only inspection).
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.passes import lower
from tilews.lowering.target import Target

from .emit import emit
from .launch import TlProgram, ensure_interpreter

__all__ = ["TlProgram", "build", "emit", "ensure_interpreter"]


def build(kernel: ir.Kernel, target: Target) -> TlProgram:
    """Lower ``kernel`` for a triton ``target``, emit it and load it (Triton is imported here)."""
    lowered = lower(kernel, target)
    return TlProgram(emit(lowered), lowered.name, lowered, target.triton_interpreter)
