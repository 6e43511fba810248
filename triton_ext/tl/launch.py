"""Loading and launching emitted ``triton.language`` source.

The source is written through the artifact store to a real file (``triton_ext.modules``) and its
kernel function wrapped with ``triton.jit``. Triton is imported here lazily: importing tilews
works where Triton is absent.

Triton's CPU interpreter must be chosen before ``triton`` is first imported (its standard library
is created as jitted functions at import); ``ensure_interpreter`` does that or says why it cannot.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Optional

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentRules
from tilews.lowering.backend import ArtifactStore
from tilews.lowering.plans import StreamPlan

from ..launcher import Launcher, bound_launch
from ..modules import load_module
from ..pysource import GRID_SUFFIX


def ensure_interpreter() -> None:
    """Make Triton run kernels with its CPU interpreter (``TRITON_INTERPRET=1``)."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.zeros, InterpretedFunction):
        raise RuntimeError("Triton was imported without its interpreter, and it cannot be switched on "
                           "afterwards; set TRITON_INTERPRET=1 in the environment before anything "
                           "imports triton (or call tilews.triton_ext.tl.ensure_interpreter() first)")


class TlProgram:
    """An emitted kernel, loaded and ready to launch."""

    def __init__(self, source: str, kernel: ir.Kernel, store: ArtifactStore, interpreter: bool):
        if interpreter:
            ensure_interpreter()
        import triton
        module = load_module(store, source, "tilews_tl")
        self.source = source
        self.kernel = kernel
        self.rules = ArgumentRules()
        self.fn = triton.jit(getattr(module, kernel.name))
        self.grid_fn = getattr(module, kernel.name + GRID_SUFFIX)
        self.num_warps = kernel.plan(StreamPlan).num_warps
        self.launcher = Launcher(self.fn, self.num_warps)
        self._arguments = _arguments_of(kernel.params, kernel.plan(StreamPlan).passed(kernel.params))

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text: ``"tl"`` (the emitted source), and Triton's stages (``"ttir"``,
        ``"ttgir"``, ``"ptx"``, ...) once Triton has compiled the kernel for a GPU."""
        compiled = next(iter(self.launcher.compiled.values()), None)
        stages = getattr(compiled, "asm", None) or {}
        return {"tl": self.source, **{k: v for k, v in stages.items() if isinstance(v, str)}}

    def launch(self, values: list) -> None:
        """Run the kernel on checked ``values`` aligned with ``kernel.params`` (tensors for
        buffers, numbers for scalars), on the current torch stream."""
        args, scalars = self._arguments(*values)
        self.launcher.launch(self.grid_fn(*scalars), args)

    def bound_launch(self) -> Callable[[list], None]:
        """``launch`` for the values of one call signature (the caller keys it on at least that,
        as ``Kernel.bound`` does): after a first ``launch``, straight to Triton's C launcher
        where it may (``launcher.bound_launch``)."""
        return bound_launch(lambda values: self.launch(values), self._direct)

    def _direct(self, values: list) -> Optional[Callable[[list], bool]]:
        """``Launcher.direct`` for ``bound_launch``, after ``values`` were launched."""
        arguments, grid_fn = self._arguments, self.grid_fn

        def prepared(v: list) -> tuple:
            args, scalars = arguments(*v)
            return grid_fn(*scalars), args
        return self.launcher.direct(values, arguments(*values)[0], lambda compiled: prepared)


def _arguments_of(params, passed) -> Callable[..., tuple[list, tuple]]:
    """A function of the launch values (in ``params`` order) returning the kernel's arguments
    (of the ``passed`` parameters: each buffer followed by its strides, each float scalar as a
    float, other scalars as they are) and the grid function's (every scalar), spelled out once
    for these parameters."""
    names = [f"a{i}" for i in range(len(params))]
    args, scalars = [], []
    for a, p in zip(names, params):
        if not isinstance(p, ir.Buffer):
            scalars.append(a)
        if p not in passed:
            continue
        if isinstance(p, ir.Buffer):
            args.append(f"{a}, *{a}.stride()")
        else:
            args.append(f"float({a})" if p.dtype.is_float else a)
    scope: dict = {}
    exec(f"def arguments({', '.join(names)}):\n"
         f"    return [{', '.join(args)}], ({''.join(s + ', ' for s in scalars)})", scope)
    return scope["arguments"]
