"""The backend registry: which backends exist, and which chain of them serves each target.

A chain is tried in order by ``compiler.compile_kernel``: the first backend that does not refuse
the program compiles it; each refusal's reason goes to the compile report. Backends are imported
only when a chain that holds them is built (the Triton ones import Triton lazily as well).

| target      | chain                         |
|-------------|-------------------------------|
| interpret   | interpret                     |
| triton      | tl (GPU, or Triton's CPU interpreter) |
| hopper      | gluon -> tl                   |
| metal       | metal                         |

Pass configs (``tilews.pass_config``) shape a chain: without warp specialization the backends in
``WARP_SPECIALIZED`` are left out, and with fast math (register copies) every backend builds for
its target with ``fast_math`` (``register_copies``) set (part of its fingerprint, so of the cache
key).
"""
from __future__ import annotations

import dataclasses
import importlib

from tilews.lowering.backend import Backend, Services

from .pass_config import PassOptions

# backend name -> the module whose make(services) builds it
BACKENDS = {"interpret": "tilews.lowering.interpreter.backend",
            "tl": "tilews.triton_ext.tl.backend",
            "gluon": "tilews.triton_ext.gluon.backend",
            "metal": "tilews.metal.backend"}
CHAINS = {"interpret": ("interpret",), "triton": ("tl",), "hopper": ("gluon", "tl"),
          "metal": ("metal",)}
# the backends that warp-specialize (with TMA producers): off under tl.disable_warp_specialized
WARP_SPECIALIZED = frozenset({"gluon"})


def make(name: str, services: Services) -> Backend:
    return importlib.import_module(BACKENDS[name]).make(services)


def chain(target: str, services: Services, passes: PassOptions = PassOptions()) -> tuple[Backend, ...]:
    """The backends serving ``target`` (a resolved target name) under ``passes``, in the order
    they are tried."""
    built, left_out = [], skipped(target, passes)
    for name in CHAINS[target]:
        if name in left_out:
            continue
        backend = make(name, services)
        choices = {k: True for k in ("fast_math", "register_copies") if getattr(passes, k)}
        if choices:
            backend = type(backend)(dataclasses.replace(backend.target, **choices), services)
        built.append(backend)
    return tuple(built)


def skipped(target: str, passes: PassOptions) -> tuple[str, ...]:
    """The backends of ``target``'s chain that ``passes`` leave out."""
    if passes.warp_specialization:
        return ()
    return tuple(name for name in CHAINS[target] if name in WARP_SPECIALIZED)


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
