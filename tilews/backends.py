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

A backend's config (``BackendConfig``: capabilities, pipeline, schedule policy, code options) is
made in one place, ``configure``: the capabilities from the machine as the backend sees it, the
policy from the settings, the code options from the pass configs (all part of its fingerprint, so
of the cache key). Without warp specialization (``tl.disable_warp_specialized``) the backends in
``WARP_SPECIALIZED`` are left out of a chain.
"""
from __future__ import annotations

import importlib

from tilews.lowering.backend import Backend, Services
from tilews.lowering.config import BackendConfig, CodegenOptions, SchedulePolicy

from .pass_config import PassOptions

# backend name -> (module, class)
BACKENDS = {"interpret": ("tilews.lowering.interpreter.backend", "InterpreterBackend"),
            "tl": ("tilews.triton_ext.tl.backend", "TlBackend"),
            "gluon": ("tilews.triton_ext.gluon.backend", "GluonBackend"),
            "metal": ("tilews.metal.backend", "MetalBackend")}
CHAINS = {"interpret": ("interpret",), "triton": ("tl",), "hopper": ("gluon", "tl"),
          "metal": ("metal",)}
# the backends that warp-specialize (with TMA producers): off under tl.disable_warp_specialized
WARP_SPECIALIZED = frozenset({"gluon"})


def backend_class(name: str) -> type[Backend]:
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)


def configure(cls: type[Backend], services: Services, passes: PassOptions = PassOptions()) -> BackendConfig:
    """The config backend ``cls`` builds with, here: the one place where the machine, the
    settings and the pass configs become capabilities, a schedule policy and code options."""
    return BackendConfig(cls.capabilities(services.machine), cls.pipeline,
                         SchedulePolicy(overlap_softmax=services.settings.overlap_softmax,
                                        overlap_gemms=services.settings.overlap_gemms,
                                        merge_releases=services.settings.merge_releases,
                                        split_partials=services.settings.split_partials,
                                        sum_partials=services.settings.sum_partials,
                                        reduce_role=services.settings.reduce_role,
                                        take_turns=services.settings.take_turns,
                                        overlap_promotion=services.settings.overlap_promotion),
                         CodegenOptions(fast_math=passes.fast_math,
                                        register_copies=passes.register_copies))


def make(name: str, services: Services, passes: PassOptions = PassOptions()) -> Backend:
    cls = backend_class(name)
    return cls(configure(cls, services, passes), services)


def chain(target: str, services: Services, passes: PassOptions = PassOptions()) -> tuple[Backend, ...]:
    """The backends serving ``target`` (a resolved target name) under ``passes``, in the order
    they are tried."""
    left_out = skipped(target, passes)
    return tuple(make(name, services, passes) for name in CHAINS[target] if name not in left_out)


def skipped(target: str, passes: PassOptions) -> tuple[str, ...]:
    """The backends of ``target``'s chain that ``passes`` leave out."""
    if passes.warp_specialization:
        return ()
    return tuple(name for name in CHAINS[target] if name in WARP_SPECIALIZED)


def option_names(target: str) -> frozenset[str]:
    """The ``tilews.jit`` options the backends serving ``target`` (a resolved target name) take:
    the union of their ``Backend.options``."""
    return frozenset().union(*(backend_class(name).options for name in CHAINS[target]))
