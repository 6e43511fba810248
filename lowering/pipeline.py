"""Pipelines: a backend's passes, in order, grouped into named phases.

Each backend declares its own ``Pipeline`` (``<backend>/backend.py``): which passes it runs is
written there and nowhere else, with the reason for each position next to it; a pass never decides
whether it applies to a target. Each pass is a module with ``run(kernel, config) -> kernel``:
pure, location-preserving, its contract in its module docstring. ``lower`` runs ``verify`` after
the frontend and after every pass, and calls ``observe(name, kernel)`` after each (dumps, tests,
timing).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from . import ir, printer, verify

if TYPE_CHECKING:
    from .config import BackendConfig

Observer = Callable[[str, ir.Kernel], None]


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[ir.Kernel, "BackendConfig"], ir.Kernel] = field(repr=False, compare=False)

    @staticmethod
    def of(module) -> "Pass":
        """The pass of a pass module (``lowering/passes/<name>.py``), named by its module."""
        return Pass(module.__name__.rsplit(".", 1)[-1], module.run)

    def only_where(self, applies: Callable[[ir.Kernel], bool]) -> "Pass":
        """This pass, run only on the kernels ``applies`` accepts (others pass unchanged)."""
        run = self.run
        return Pass(self.name, lambda kernel, config: run(kernel, config) if applies(kernel) else kernel)


@dataclass(frozen=True)
class Phase:
    name: str
    passes: tuple[Pass, ...]


@dataclass(frozen=True)
class Pipeline:
    phases: tuple[Phase, ...]

    @property
    def passes(self) -> tuple[Pass, ...]:
        return tuple(p for phase in self.phases for p in phase.passes)

    @property
    def pass_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def without(self, name: str) -> "Pipeline":
        """This pipeline less the pass ``name`` (tests that show what a pass is for)."""
        return Pipeline(tuple(Phase(ph.name, tuple(p for p in ph.passes if p.name != name))
                              for ph in self.phases))

    def describe(self) -> str:
        """One line per phase: ``phase: pass, pass`` (docs/design.md shows these)."""
        return "\n".join(f"{ph.name}: {', '.join(p.name for p in ph.passes)}" for ph in self.phases)


def lower(kernel: ir.Kernel, config: "BackendConfig", observe: Optional[Observer] = None,
          upto: Optional[str] = None, dump_dir: Optional[Path] = None) -> ir.Kernel:
    """Run ``config``'s pipeline (up to and including pass ``upto``, if given); ``dump_dir`` (the
    ``TILEWS_DUMP_IR`` setting, a folder ``Settings.ready_dump_folder`` made) receives the IR
    after each pass."""
    names = config.pipeline.pass_names
    if upto is not None and upto not in names:
        raise ValueError(f"lower: the pipeline of target '{config.name}' has no pass {upto!r} "
                         f"(it runs {', '.join(names)})")
    observers = [o for o in (observe, _dump_observer(dump_dir)) if o is not None]
    verify.run(kernel)
    for o in observers:
        o("frontend", kernel)
    for p in config.pipeline.passes:
        kernel = p.run(kernel, config)
        verify.run(kernel)
        for o in observers:
            o(p.name, kernel)
        if p.name == upto:
            break
    return kernel


def _dump_observer(root: Optional[Path]) -> Optional[Observer]:
    """Writes the IR after each pass to ``root`` as ``<kernel>.<n>.<pass>.tir``."""
    if root is None:
        return None
    counter = iter(range(1 << 30))

    def dump(name: str, kernel: ir.Kernel) -> None:
        (Path(root) / f"{kernel.name}.{next(counter):02d}.{name}.tir").write_text(printer.to_text(kernel))
    return dump
