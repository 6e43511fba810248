"""The interpreter as a backend: the lowered IR is the program, executed by ``program.execute``.

Options (``tilews.jit``): ``seed`` (the scheduler's), ``accumulate_f64``.
"""
from __future__ import annotations

from .. import ir, printer
from ..arguments import ArgumentRules
from ..backend import Backend, Machine
from ..capabilities import INTERPRETER, Capabilities
from ..config import BackendConfig
from ..passes import insert_syncs, legalize, plan_buffers, swizzle_grid, warp_specialize
from ..pipeline import Pass, Phase, Pipeline
from ..traverse import per_thread_code
from .program import execute

PIPELINE = Pipeline((
    # An explicit T.ws program becomes its roles' projections, which the interpreter runs
    # concurrently (under its seeded scheduler); a program without roles is unchanged.
    Phase("specialize", (Pass.of(warp_specialize),)),
    Phase("plan memory", (Pass.of(plan_buffers),)),
    # Copy mechanisms (masks where bounds are not proven) and unroll rules, as every backend.
    Phase("legalize", (Pass.of(legalize),)),
    # Per-thread code (T.get_thread_binding) gets the block barriers a SIMT target needs, so that
    # the interpreter's thread-level race checks judge the program those targets run; tile-level
    # kernels need none here (a tile statement is one step).
    Phase("sync", (Pass.of(insert_syncs).only_where(lambda k: per_thread_code(k.body)),)),
    # Last: a swizzled grid's block indices become the panel order.
    Phase("grid", (Pass.of(swizzle_grid),)),
))


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
    pipeline = PIPELINE

    @classmethod
    def capabilities(cls, machine: Machine) -> Capabilities:
        return INTERPRETER

    def emit(self, lowered: ir.Kernel) -> str:
        return printer.to_text(lowered)

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> InterpreterProgram:
        return InterpreterProgram(lowered, source, int(options.get("seed", 0)),
                                  bool(options.get("accumulate_f64", False)))


INTERPRET = BackendConfig(INTERPRETER, PIPELINE)   # the interpreter's config without pass configs
