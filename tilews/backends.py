"""The backend registry: which backends exist, and which chain of them serves each target.

A chain is tried in order by ``compiler.compile_kernel``: the first backend that does not refuse
the program compiles it; each refusal's reason goes to the compile report. Backends are imported
only when a chain that holds them is built (the Triton ones import Triton lazily as well).

| target      | chain                         |
|-------------|-------------------------------|
| interpret   | interpret                     |
| triton      | tl (GPU, or Triton's CPU interpreter) |
| hopper      | gluon -> tl                   |
"""
from __future__ import annotations

import importlib

from tilews.lowering.backend import Backend, Services

# backend name -> the module whose make(services) builds it
BACKENDS = {"interpret": "tilews.lowering.interpreter.backend",
            "tl": "tilews.triton_ext.tl.backend",
            "gluon": "tilews.triton_ext.gluon.backend"}
CHAINS = {"interpret": ("interpret",), "triton": ("tl",), "hopper": ("gluon", "tl")}


def make(name: str, services: Services) -> Backend:
    return importlib.import_module(BACKENDS[name]).make(services)


def chain(target: str, services: Services) -> tuple[Backend, ...]:
    """The backends serving ``target`` (a resolved target name), in the order they are tried."""
    return tuple(make(name, services) for name in CHAINS[target])


def option_names(target: str) -> frozenset[str]:
    """The ``tilews.jit`` options the backends serving ``target`` (a resolved target name) take:
    the union of their ``Backend.options``."""
    names: set[str] = set()
    for name in CHAINS[target]:
        module = importlib.import_module(BACKENDS[name])
        names.update(*(cls.options for cls in vars(module).values()
                       if isinstance(cls, type) and issubclass(cls, Backend)
                       and cls.__module__ == module.__name__))
    return frozenset(names)
