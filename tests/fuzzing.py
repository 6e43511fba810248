"""Shared pieces of the differential fuzz tests (``test_fuzz_programs``, ``test_fuzz_numeric``):
loading a generated program's source as a module, the hypothesis settings a profile asks for, and
whether the Metal harness can run here."""
from __future__ import annotations

import importlib.util
import itertools
import os
import tempfile

from hypothesis import HealthCheck, seed, settings

_DIR = tempfile.mkdtemp(prefix="tilews-fuzz-")
_COUNT = itertools.count()


def load_factory(text: str, name: str = "make"):
    """The function ``name`` of a module whose source is ``text`` (written to a file: kernels
    need their source to be readable)."""
    path = os.path.join(_DIR, f"fuzz_{next(_COUNT)}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def profile(examples: int, fixed_seed: int | None):
    """hypothesis's settings for ``examples`` programs: derandomized (the same programs each run)
    unless ``fixed_seed`` is given, which draws that seed's programs instead."""
    def apply(test):
        test = settings(max_examples=examples, deadline=None, derandomize=fixed_seed is None,
                        suppress_health_check=[HealthCheck.too_slow,
                                               HealthCheck.data_too_large])(test)
        return seed(fixed_seed)(test)
    return apply


def metal_runs_here() -> bool:
    """Whether the Metal harness can build here (it needs a C++17 compiler)."""
    from tilews.metal import harness
    return harness.compiler() is not None
