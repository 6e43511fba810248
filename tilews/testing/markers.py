"""TileLang's pytest skip markers: ``requires_cuda``, ``requires_cuda_compute_version(major, minor,
mode)`` with its ``_ge``/``_gt``/``_le``/``_lt``/``_eq`` forms, and ``requires_package``.

As in TileLang, each decides when it decorates (at import of the test module) from the machine
then: a CUDA GPU is one torch sees that is not ROCm's, and its compute capability is
``tilews.contrib.nvcc``'s. A compute-version marker also requires CUDA, and on a machine without
a GPU compares (0, 0). pytest is imported only when a marker is built, so ``tilews.testing``'s
other helpers work without it."""
from __future__ import annotations

import importlib
import operator
from typing import Callable

import torch

from tilews.contrib import nvcc

# the comparisons of a compute-version marker: mode -> (have, wanted) -> bool
_MODES = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt,
          "eq": operator.eq}


def _skip_unless(condition: bool, reason: str) -> Callable:
    import pytest
    return pytest.mark.skipif(not condition, reason=reason)


def _has_cuda() -> bool:
    return torch.cuda.is_available() and torch.version.hip is None


def requires_cuda(func: Callable) -> Callable:
    """Skip the test unless this machine has a CUDA GPU."""
    return _skip_unless(_has_cuda(), "needs a CUDA GPU")(func)


def requires_cuda_compute_version(major_version: int, minor_version: int = 0,
                                  mode: str = "ge") -> Callable[[Callable], Callable]:
    """Skip the test unless the CUDA GPU's compute capability compares with
    ``(major_version, minor_version)`` by ``mode`` ("ge", the default, "gt", "le", "lt", "eq")."""
    if mode not in _MODES:
        raise ValueError(f"requires_cuda_compute_version: mode must be one of "
                         f"{', '.join(_MODES)}; got {mode!r}")
    wanted = (major_version, minor_version)
    have = nvcc.parse_compute_version(nvcc.get_target_compute_version()) if _has_cuda() else (0, 0)
    mark = _skip_unless(_MODES[mode](have, wanted),
                        f"needs CUDA compute capability {mode} {major_version}.{minor_version}, "
                        f"this machine has {have[0]}.{have[1]}")
    return lambda func: requires_cuda(mark(func))


def requires_cuda_compute_version_ge(major_version: int, minor_version: int = 0):
    return requires_cuda_compute_version(major_version, minor_version, "ge")


def requires_cuda_compute_version_gt(major_version: int, minor_version: int = 0):
    return requires_cuda_compute_version(major_version, minor_version, "gt")


def requires_cuda_compute_version_le(major_version: int, minor_version: int = 0):
    return requires_cuda_compute_version(major_version, minor_version, "le")


def requires_cuda_compute_version_lt(major_version: int, minor_version: int = 0):
    return requires_cuda_compute_version(major_version, minor_version, "lt")


def requires_cuda_compute_version_eq(major_version: int, minor_version: int = 0):
    return requires_cuda_compute_version(major_version, minor_version, "eq")


def requires_package(*packages: str) -> Callable[[Callable], Callable]:
    """Skip the test unless every one of ``packages`` imports."""
    missing = [p for p in packages if not _imports(p)]
    return _skip_unless(not missing, f"needs the package(s) {', '.join(missing)}")


def _imports(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True
