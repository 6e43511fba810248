"""The interpreter as a backend: the lowered IR is the program, executed by ``program.execute``.

Options (``tilews.jit``): ``seed`` (the scheduler's), ``accumulate_f64``.
"""
from __future__ import annotations


from .. import ir, printer
from ..arguments import ArgumentRules
from ..backend import Backend, Services
from ..target import INTERPRET
from .program import execute


class InterpreterProgram:
    rules = ArgumentRules()

    def __init__(self, kernel: ir.Kernel, source: str, seed: int, accumulate_f64: bool):
        self.kernel, self.source = kernel, source
        self.seed, self.accumulate_f64 = seed, accumulate_f64

    @property
    def asm(self) -> dict[str, str]:
        return {}

    def launch(self, values: list) -> None:
        execute(self.kernel, values, seed=self.seed, accumulate_f64=self.accumulate_f64)


class InterpreterBackend(Backend):
    name = "interpret"
    options = frozenset({"seed", "accumulate_f64"})

    def emit(self, lowered: ir.Kernel) -> str:
        return printer.to_text(lowered)

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> InterpreterProgram:
        return InterpreterProgram(lowered, source, int(options.get("seed", 0)),
                                  bool(options.get("accumulate_f64", False)))


def make(services: Services) -> InterpreterBackend:
    return InterpreterBackend(INTERPRET, services)
