"""Per-target emission and execution: the one place a ``Target`` picks a backend."""
from __future__ import annotations

from typing import Any

from tilews.lowering import ir, printer
from tilews.lowering.target import Target


def emit_source(target: Target, kernel: ir.Kernel) -> str:
    """The generated program for ``kernel`` (the lowered IR itself for the interpreter)."""
    if target.name == "interpret":
        return printer.to_text(kernel)
    if target.name == "triton":
        from tilews.triton_ext.tl import emit
        return emit(kernel)
    if target.name == "hopper":
        from tilews.triton_ext.gluon import emit
        return emit(kernel)
    raise ValueError(f"internal: no emitter for target '{target.name}'")


class InterpretExecutor:
    """Runs the lowered IR in the reference interpreter."""

    def __init__(self, kernel: ir.Kernel, source: str, options: dict[str, Any]):
        self.kernel, self.source = kernel, source
        self.seed = int(options.get("seed", 0))
        self.accumulate_f64 = bool(options.get("accumulate_f64", False))
        self.asm: dict[str, str] = {}

    def launch(self, values: list) -> None:
        from tilews.lowering import interpreter
        interpreter.run(self.kernel, values, seed=self.seed, accumulate_f64=self.accumulate_f64)


def make_executor(target: Target, kernel: ir.Kernel, source: str, options: dict[str, Any]):
    if target.name == "interpret":
        return InterpretExecutor(kernel, source, options)
    if target.name == "triton":
        from tilews.triton_ext.tl import TlProgram
        return TlProgram(source, kernel.name, kernel, interpreter=target.triton_interpreter)
    if target.name == "hopper":
        from tilews.triton_ext.gluon import GluonProgram
        return GluonProgram(source, kernel.name, kernel)
    raise ValueError(f"internal: no executor for target '{target.name}'")
