"""The compiled kernel object users call: ``out = kernel(*inputs)``, with TileLang's tools on it
(``get_profiler``, ``params``, ``out_idx``, and the autotuner's ``latency``/``config``/``ref_latency``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from tilews.lowering import ir, printer
from tilews.lowering.backend import Program
from tilews.lowering.settings import Settings

from .binding import Binder
from .profiler import Profiler, TensorSupplyType


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


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a compiled kernel (TileLang's ``KernelParam``). ``dtype`` is a tilews dtype,
    equal to its TileLang name (``"float16"``); ``shape`` holds ints, and the name of each runtime
    (``T.dynamic``) dim; a runtime scalar has ``scalar`` set and shape ``()``."""
    name: str
    dtype: ir.DType
    shape: tuple[Union[int, str], ...]
    is_output: bool = False     # allocated and returned by the kernel (``out_idx``)
    scalar: bool = False

    @classmethod
    def of(cls, name: str, param: Union[ir.Buffer, ir.Var], is_output: bool) -> "KernelParam":
        if isinstance(param, ir.Var):
            return cls(name, param.dtype, (), is_output, scalar=True)
        shape = tuple(ir.as_int(d) if ir.as_int(d) is not None else d.name for d in param.shape)
        return cls(name, param.dtype, shape, is_output)

    def is_scalar(self) -> bool:
        return self.scalar

    def is_unsigned(self) -> bool:
        return self.dtype.record.kind == "uint"

    def is_float8(self) -> bool:
        return self.dtype.is_float and self.dtype.bits == 8

    def is_boolean(self) -> bool:
        return self.dtype.record.kind == "bool"

    def torch_dtype(self) -> torch.dtype:
        return self.dtype.torch_dtype


class Kernel:
    """A compiled kernel. Calling it checks the arguments, allocates ``out_idx`` outputs on the
    inputs' device, launches, and returns the outputs: one tensor, a list of them (in ``out_idx``
    order), or None.

    ``latency``, ``config`` and ``ref_latency`` are None unless the autotuner set them (the
    winning config's latency in ms, its dict, the reference program's latency)."""

    def __init__(self, ir_before: ir.Kernel, ir_after: ir.Kernel, user_params: Sequence[str],
                 out_idx: Sequence[int], program: Program, report: CompileReport,
                 settings: Settings = Settings()):
        self.ir_before = ir_before
        self.ir_after = ir_after
        self.program = program
        self.binder = Binder(ir_after, user_params, out_idx, program.rules, settings.poison_outputs)
        self.report = report
        self.latency: float | None = None
        self.config: dict | None = None
        self.ref_latency: float | None = None

    @property
    def name(self) -> str:
        return self.ir_after.name

    @property
    def target(self) -> str:
        return self.report.target

    @property
    def params(self) -> list[KernelParam]:
        """The parameters the user's function declares, in order, outputs included."""
        outs = set(self.binder.out_positions)
        return [KernelParam.of(p.name, p.param, i in outs) for i, p in enumerate(self.binder.params)]

    @property
    def out_idx(self) -> list[int]:
        """The positions in ``params`` of the outputs the kernel allocates and returns, in order."""
        return list(self.binder.out_positions)

    @property
    def device(self) -> torch.device:
        """Where the kernel runs: the GPU for a Triton or Gluon program on a machine with one,
        else the CPU (the interpreter, Triton's CPU interpreter)."""
        on_gpu = self.report.backend != "interpret" and torch.cuda.is_available()
        return torch.device("cuda" if on_gpu else "cpu")

    def __call__(self, *args):
        values, outs = self.binder.bind(args)
        self.program.launch(values)
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs

    def bound(self, args: Sequence):
        """A call ``f(*args)`` doing what calling the kernel does (its last output, or None) for
        arguments of ``args``'s signature: the binding fixed to that signature
        (``Binder.bound``), then the launch. The caller keys it on at least the signature."""
        bind, launch = self.binder.bound(args), self.program.launch

        def call(*args):
            values, outs = bind(*args)
            launch(values)
            return outs[-1] if outs else None
        return call

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        """The generated program (``triton.language`` or Gluon source, or the lowered IR the
        interpreter runs). The module holds the kernel and its small host-side grid function, so
        ``kernel_only`` (TileLang's choice between device and host code) changes nothing."""
        return self.program.source

    def get_profiler(self, tensor_supply_type: TensorSupplyType = TensorSupplyType.Auto) -> Profiler:
        """A ``tilews.profiler.Profiler`` of this kernel, generating inputs by
        ``tensor_supply_type``."""
        return Profiler(self, tensor_supply_type)

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text, as Triton's ``asm`` (``"tl"`` source; ``"ttgir"``/``"ptx"`` once
        Triton has compiled the kernel on a GPU; ``"tir"`` the lowered IR)."""
        return {"tir": printer.to_text(self.ir_after), **self.program.asm}

    def ir_text(self, stage: str = "after") -> str:
        return printer.to_text(self.ir_before if stage == "before" else self.ir_after)

    def __repr__(self) -> str:
        return f"<tilews.Kernel {self.name} target={self.target} inputs=({', '.join(self.binder.input_names)})>"
