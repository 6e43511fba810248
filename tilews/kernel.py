"""The compiled kernel object users call: ``out = kernel(*inputs)``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilews.lowering import ir, printer
from tilews.lowering.backend import Program
from tilews.lowering.settings import Settings

from .binding import Binder


@dataclass(frozen=True)
class CompileReport:
    """What the compiler did: target, passes with their times, notes (fallbacks and why), shared
    memory, whether the on-disk cache answered."""
    target: str
    backend: str
    notes: tuple[str, ...]
    passes: tuple[tuple[str, float], ...]
    cache_hit: bool
    shared_bytes: int
    compile_ms: float

    def __str__(self) -> str:
        lines = [f"target: {self.target} (backend {self.backend})   compile: {self.compile_ms:.1f} ms"
                 f"{' (disk cache hit)' if self.cache_hit else ''}",
                 f"shared memory: {self.shared_bytes} bytes",
                 "passes: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in self.passes)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


class Kernel:
    """A compiled kernel. Calling it checks the arguments, allocates ``out_idx`` outputs on the
    inputs' device, launches, and returns the outputs (one tensor, a tuple, or None)."""

    def __init__(self, ir_before: ir.Kernel, ir_after: ir.Kernel, user_params: Sequence[str],
                 out_idx: Sequence[int], program: Program, report: CompileReport,
                 settings: Settings = Settings()):
        self.ir_before = ir_before
        self.ir_after = ir_after
        self.program = program
        self.binder = Binder(ir_after, user_params, out_idx, program.rules, settings.poison_outputs)
        self.report = report

    @property
    def name(self) -> str:
        return self.ir_after.name

    @property
    def target(self) -> str:
        return self.report.target

    def __call__(self, *args):
        values, outs = self.binder.bind(args)
        self.program.launch(values)
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def get_kernel_source(self) -> str:
        """The generated program (``triton.language`` source, or the lowered IR the interpreter
        runs)."""
        return self.program.source

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text, as Triton's ``asm`` (``"tl"`` source; ``"ttgir"``/``"ptx"`` once
        Triton has compiled the kernel on a GPU; ``"tir"`` the lowered IR)."""
        return {"tir": printer.to_text(self.ir_after), **self.program.asm}

    def ir_text(self, stage: str = "after") -> str:
        return printer.to_text(self.ir_before if stage == "before" else self.ir_after)

    def __repr__(self) -> str:
        return f"<tilews.Kernel {self.name} target={self.target} inputs=({', '.join(self.binder.input_names)})>"
