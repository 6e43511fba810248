"""The backend interface: what the compiler asks of every backend, and what it hands one.

A backend takes a kernel from the frontend to something that runs on one target::

    lowered = backend.lower(kernel, observe)   # its pipeline, with its BackendConfig
    reason  = backend.refuses(lowered)         # None, or why this program is not for it
    source  = backend.emit(lowered)            # the generated code (emitters only spell plans)
    program = backend.load(lowered, source, options)   # a Program: launch(values), asm, rules
    needed  = backend.shared_bytes(program)   # shared memory as its toolchain counts it

``tilews.compiler.compile_kernel`` walks a target's chain of backends (``tilews.backends``), takes
the first that does not refuse and records each refusal's reason in the compile report. The
lowered kernel and its source are cached under a key that includes ``backend.fingerprint()``.
Where a loaded program needs more shared memory than ``config.caps.smem_bytes`` (the plan plus
the toolchain's own scratch), the compiler lowers it again with ``with_config`` of a config whose
``smem_bytes`` leaves that scratch room.

What a backend needs from outside comes in ``Services`` at construction (the artifact store,
the settings, the machine); backends never import the ``tilews`` user surface. Arguments reach
``Program.launch`` already checked (``lowering.arguments``, against the kernel's parameters and
the program's ``ArgumentRules``), aligned with ``kernel.params``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

from . import ir
from .arguments import ArgumentRules
from .capabilities import Capabilities
from .config import BackendConfig
from .pipeline import Observer, Pipeline, lower
from .settings import Settings


class ArtifactStore(Protocol):
    """Bytes by key on disk (``tilews.cache.DiskCache``), and content-addressed source files."""

    def fetch(self, parts: tuple, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """The bytes stored under the key made of ``parts`` (plain values), built (once across
        processes) if missing; and whether they came from the store."""

    def source_file(self, text: str, suffix: str = ".py") -> Path:
        """A file holding ``text`` (tools like Triton read kernel source through ``inspect``)."""


@dataclass(frozen=True)
class Machine:
    """What the compiler knows of the machine it runs on."""
    cuda: bool = False                          # a CUDA (or ROCm) GPU is visible
    capability: Optional[tuple[int, int]] = None  # compute capability of the current CUDA device
    num_sms: int = 132                          # its multiprocessors (an H100 SXM's without one)


@dataclass(frozen=True)
class Services:
    store: ArtifactStore
    settings: Settings = field(default_factory=Settings)
    machine: Machine = field(default_factory=Machine)


class Program(Protocol):
    source: str
    rules: ArgumentRules

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text (as Triton's ``asm``)."""

    def launch(self, values: list) -> None:
        """Run on checked ``values`` aligned with ``kernel.params``."""

    # optional: ``bound_launch() -> launch`` for the values of one call signature, which a kept
    # call (``tilews.Kernel.bound``) uses where a program has it (Gluon's and tl's go straight to
    # Triton's C launcher); a program without it is launched by ``launch``


class Backend(abc.ABC):
    """One backend: a name, its config (capabilities, pipeline, options), and the four steps
    above. A backend class says what it builds with: its ``pipeline`` and the ``capabilities``
    of the machine it builds for (``tilews.backends.configure`` makes its config from them)."""
    name: str = ""
    options: frozenset[str] = frozenset()   # the ``tilews.jit`` options it takes
    pipeline: Pipeline

    def __init__(self, config: BackendConfig, services: Services):
        self.config = config
        self.services = services

    @classmethod
    @abc.abstractmethod
    def capabilities(cls, machine: Machine) -> Capabilities:
        """The machine this backend builds for, as its passes see it."""

    def lower(self, kernel: ir.Kernel, observe: Optional[Observer] = None) -> ir.Kernel:
        return lower(kernel, self.config, observe, dump_dir=self.services.settings.dump_ir)

    def refuses(self, lowered: ir.Kernel) -> Optional[str]:
        """Why this backend cannot run ``lowered`` (the next one of the chain is tried)."""
        return None

    @abc.abstractmethod
    def emit(self, lowered: ir.Kernel) -> str:
        ...

    @abc.abstractmethod
    def load(self, lowered: ir.Kernel, source: str, options: dict) -> Program:
        ...

    def shared_bytes(self, program: Program) -> Optional[int]:
        """The shared memory per block ``program`` (from ``load``) needs as its toolchain counts it:
        the lowering's ``SharedMemoryPlan`` and the toolchain's own scratch beside it; None where
        it is not known before launch (the default: a toolchain compiling at launch, or none)."""
        return None

    def with_config(self, config: BackendConfig) -> "Backend":
        """This backend with ``config`` instead of its own (same services)."""
        return type(self)(config, self.services)

    def fingerprint(self) -> tuple:
        """What, besides the IR and tilews's own sources, determines this backend's output."""
        return (self.name, repr(self.config))
