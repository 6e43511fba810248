"""A loaded Metal kernel: one ``MslKernel``, launched where its tensors are.

* tensors on ``mps`` (a Mac): ``torch.mps.compile_shader`` on the tensors in place (``MpsLauncher``);
* tensors on the CPU: the CPU harness (``metal/harness.py``) compiles the same kernel text as C++
  and runs each threadgroup with one thread per lane — correct results, no speed; it needs a C++17
  compiler and says so when there is none.

mlx users call ``MlxLauncher`` (``metal/mlx_launch.py``) on mlx arrays with the same ``MslKernel``
(``program.msl``). Buffers are row-major and contiguous: a non-contiguous tensor is run through a
contiguous copy (written back for the parameters the kernel writes). The grid of threadgroups is
the kernel's grid evaluated on the call's scalar values.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentRules
from tilews.lowering.errors import InternalError
from tilews.lowering.simplify import evaluate

from .source import MslKernel, MslParam


class MetalProgram:
    rules = ArgumentRules()

    def __init__(self, msl: MslKernel, kernel: ir.Kernel):
        self.msl = msl
        self.kernel = kernel
        self.source = msl.full_source()
        self._harness = None
        self._mps = None

    @property
    def asm(self) -> dict[str, str]:
        return {"msl": self.source}

    @property
    def runner(self) -> str:
        """Where the last launch ran ("mps", "cpu harness"), "" before one."""
        return "mps" if self._mps is not None else "cpu harness" if self._harness is not None else ""

    def grid(self, values: list) -> tuple[int, int, int]:
        env = {p: v for p, v in zip(self.kernel.params, values) if isinstance(p, ir.Var)}
        dims = []
        for g in self.kernel.grid:
            n = evaluate(g, env)
            if n is None:
                raise InternalError(f"metal backend: the grid extent of '{self.kernel.name}' is not "
                                    f"computable from its scalar parameters", self.kernel.loc)
            dims.append(int(n))
        return tuple(dims + [1] * (3 - len(dims)))

    def launch(self, values: list) -> None:
        grid = self.grid(values)
        if any(n <= 0 for n in grid):
            return
        args, copies = _contiguous(self.msl.params, values)
        if any(getattr(a, "device", None) is not None and a.device.type == "mps" for a in args):
            if self._mps is None:
                from .mps_launch import MpsLauncher
                self._mps = MpsLauncher(self.msl)
            self._mps(args, grid)
        else:
            if self._harness is None:
                from .harness import build
                self._harness = build(self.msl)
            self._harness.run(args, grid)
        for original, copy in copies:
            original.copy_(copy)


def _contiguous(params: tuple[MslParam, ...], values: list) -> tuple[list, list]:
    """The arguments with every tensor contiguous, and (original, copy) for the written ones that
    had to be copied."""
    args, copies = [], []
    for p, v in zip(params, values):
        if not p.scalar and not v.is_contiguous():
            c = v.contiguous()
            if p.written:
                copies.append((v, c))
            v = c
        args.append(v)
    return args, copies
