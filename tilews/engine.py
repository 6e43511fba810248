"""TileLang's ``tilelang.engine.lower`` (also ``tilelang.lower``): compile a ``@T.prim_func``
without running it and hand back what was generated."""
from __future__ import annotations

from dataclasses import dataclass

from tilews.lowering.frontend import KernelSource

from .jit import compile
from .kernel import KernelParam

__all__ = ["CompiledArtifact", "lower"]


@dataclass(frozen=True)
class CompiledArtifact:
    """What ``lower`` generated: the kernel's source (``Kernel.get_kernel_source()``), its
    parameters, and the target it was compiled for (``"hopper -> triton"`` where a backend fell
    back)."""
    kernel_source: str
    params: list[KernelParam]
    target: str


def lower(func_or_mod: KernelSource, target: str = "auto", target_host=None,
          runtime_only: bool = False, enable_host_codegen: bool = False,
          enable_device_compile: bool = False) -> CompiledArtifact:
    """Compile ``func_or_mod`` (a ``@T.prim_func``) for ``target`` (tilews's names) and return its
    ``CompiledArtifact``; nothing is launched. ``target_host``, ``runtime_only``,
    ``enable_host_codegen`` and ``enable_device_compile`` choose TileLang's host/device build
    steps: accepted, no effect."""
    kernel = compile(func_or_mod, target=target)
    return CompiledArtifact(kernel.get_kernel_source(), kernel.params, kernel.target)
