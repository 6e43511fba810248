"""The compiled kernel object users call: ``out = kernel(*inputs)``, with TileLang's tools on it
(``get_profiler``, ``params``, ``out_idx``, and the autotuner's ``latency``/``config``/``ref_latency``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence, Union

import torch

from tilews.lowering import ir, printer
from tilews.lowering.arguments import ArgumentRules
from tilews.lowering.backend import Program
from tilews.lowering.settings import Settings

from .binding import Binder
from .profiler import Profiler, TensorSupplyType


@dataclass(frozen=True)
class CompileReport:
    """What the compiler did: target, passes with their times, notes (fallbacks and why), shared
    memory, whether the on-disk cache answered; ``kernel``: the kernel's name.

    A function of several kernels has one report per kernel in ``kernels`` (launch order), and
    this report sums them up (``of_function``): the target and backend each kernel took (one
    value where they agree, else ``<kernel>: <value>`` per kernel), every kernel's notes and passes
    prefixed by its name, the largest shared memory of one kernel, a cache hit where every kernel
    hit, the whole compile time."""
    target: str
    backend: str
    notes: tuple[str, ...]
    passes: tuple[tuple[str, float], ...]
    cache_hit: bool
    shared_bytes: int
    compile_ms: float
    kernel: str = ""
    kernels: tuple["CompileReport", ...] = ()

    @classmethod
    def of_function(cls, parts: Sequence["CompileReport"], frontend_ms: float,
                    compile_ms: float) -> "CompileReport":
        """The report of a function whose kernels' reports are ``parts`` (in launch order); for
        one kernel, its report with the frontend's time and the whole compile time."""
        frontend = (("frontend", frontend_ms),)
        if len(parts) == 1:
            return dataclasses.replace(parts[0], passes=frontend + parts[0].passes,
                                       compile_ms=compile_ms)

        def each(field: str) -> str:
            values = [getattr(p, field) for p in parts]
            if len(set(values)) == 1:
                return values[0]
            return "; ".join(f"{p.kernel}: {v}" for p, v in zip(parts, values))
        return cls(each("target"), each("backend"),
                   tuple(f"{p.kernel}: {n}" for p in parts for n in p.notes),
                   frontend + tuple((f"{p.kernel}: {n}", ms) for p in parts for n, ms in p.passes),
                   all(p.cache_hit for p in parts), max(p.shared_bytes for p in parts), compile_ms,
                   kernels=tuple(parts))

    def __str__(self) -> str:
        if self.kernels:
            head = (f"{len(self.kernels)} kernels, launched in order   compile: "
                    f"{self.compile_ms:.1f} ms")
            return "\n".join([head] + [f"kernel {p.kernel}:\n  " + str(p).replace("\n", "\n  ")
                                       for p in self.kernels])
        lines = [f"target: {self.target} (backend {self.backend})   compile: {self.compile_ms:.1f} ms"
                 f"{' (disk cache hit)' if self.cache_hit else ''}",
                 f"shared memory: {self.shared_bytes} bytes",
                 "passes: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in self.passes)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class CompiledKernel:
    """One kernel of a compiled function: its frontend and lowered IR, the program its backend
    loaded, its report."""
    ir_before: ir.Kernel
    ir_after: ir.Kernel
    program: Program
    report: CompileReport


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
    """A compiled kernel function. Calling it checks the arguments, allocates ``out_idx``
    outputs on the inputs' device (and the function's ``T.alloc_global`` workspaces, kept for the
    next call: ``tilews.binding``), launches each of its kernels in order on the caller's stream,
    and returns the outputs: one tensor, a list of them (in ``out_idx`` order), or None.

    ``kernels``: each compiled kernel (``CompiledKernel``), in launch order; most functions have
    one. ``ir_before``, ``ir_after`` and ``program`` are the first kernel's (the only one's).

    ``latency``, ``config`` and ``ref_latency`` are None unless the autotuner set them (the
    winning config's latency in ms, its dict, the reference program's latency)."""

    def __init__(self, name: str, kernels: Sequence[CompiledKernel], user_params: Sequence[str],
                 out_idx: Sequence[int], report: CompileReport, settings: Settings = Settings()):
        self.name = name
        self.kernels = tuple(kernels)
        first = self.kernels[0]
        self.ir_before, self.ir_after, self.program = first.ir_before, first.ir_after, first.program
        lowered = ir.Function(name, tuple(k.ir_after for k in self.kernels), first.ir_after.loc)
        rules = ArgumentRules.of_all([k.program.rules for k in self.kernels])
        self.binder = Binder(lowered, user_params, out_idx, rules, settings.poison_outputs)
        self.report = report
        self.latency: float | None = None
        self.config: dict | None = None
        self.ref_latency: float | None = None

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
        on_gpu = self.kernels[0].report.backend != "interpret" and torch.cuda.is_available()
        return torch.device("cuda" if on_gpu else "cpu")

    def __call__(self, *args):
        values, outs = self.binder.bind(args)
        for k in self.kernels:
            k.program.launch(values)
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs

    def bound(self, args: Sequence):
        """A call ``f(*args)`` doing what calling the kernel does (its last output, or None) for
        arguments of ``args``'s signature: the binding fixed to that signature
        (``Binder.bound``), then each program's launch for that signature where it has one
        (``bound_launch``: Gluon's), else its launch. The caller keys it on at least the
        signature."""
        bind = self.binder.bound(args)
        launches = tuple(k.program.bound_launch() if hasattr(k.program, "bound_launch") else k.program.launch
                         for k in self.kernels)

        def call(*args):
            values, outs = bind(*args)
            for launch in launches:
                launch(values)
            return outs[-1] if outs else None
        return call

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        """The generated program (``triton.language`` or Gluon source, or the lowered IR the
        interpreter runs); of several kernels, each one's, in launch order, a blank line between.
        The module holds the kernel and its small host-side grid function, so ``kernel_only``
        (TileLang's choice between device and host code) changes nothing."""
        return "\n\n".join(k.program.source for k in self.kernels)

    def get_profiler(self, tensor_supply_type: TensorSupplyType = TensorSupplyType.Auto) -> Profiler:
        """A ``tilews.profiler.Profiler`` of this kernel, generating inputs by
        ``tensor_supply_type``."""
        return Profiler(self, tensor_supply_type)

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text, as Triton's ``asm`` (``"tl"`` source; ``"ttgir"``/``"ptx"`` once
        Triton has compiled the kernel on a GPU; ``"tir"`` the lowered IR); of several kernels,
        each stage's texts in launch order, a blank line between."""
        stages: dict[str, list[str]] = {"tir": [self.ir_text()]}
        for k in self.kernels:
            for stage, text in k.program.asm.items():
                stages.setdefault(stage, []).append(text)
        return {stage: "\n\n".join(texts) for stage, texts in stages.items()}

    def ir_text(self, stage: str = "after") -> str:
        """Every kernel's IR (``"before"``: the frontend's; else lowered), a blank line between."""
        return "\n\n".join(printer.to_text(k.ir_before if stage == "before" else k.ir_after)
                           for k in self.kernels)

    def __repr__(self) -> str:
        return f"<tilews.Kernel {self.name} target={self.target} inputs=({', '.join(self.binder.input_names)})>"
