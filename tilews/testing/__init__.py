"""Helpers for tests: tilews's own (``rel_err``, ``poison_``, ``time_ms``, ``best_device``) and
TileLang's ``tilelang.testing`` (skip markers, ``torch_assert_close``, ``set_random_seed``,
``main``). TileLang's performance-regression runner (``process_func``, ``regression``) is not
provided."""
from __future__ import annotations

import inspect
import random
import sys

import numpy as np
import torch

from tilews.utils.device import best_device
from tilews.utils.tensor import torch_assert_close

from .markers import (requires_cuda, requires_cuda_compute_version, requires_cuda_compute_version_eq,
                      requires_cuda_compute_version_ge, requires_cuda_compute_version_gt,
                      requires_cuda_compute_version_le, requires_cuda_compute_version_lt,
                      requires_package)
from .measure import poison_, rel_err, time_ms

__all__ = ["best_device", "main", "poison_", "rel_err", "requires_cuda",
           "requires_cuda_compute_version", "requires_cuda_compute_version_eq",
           "requires_cuda_compute_version_ge", "requires_cuda_compute_version_gt",
           "requires_cuda_compute_version_le", "requires_cuda_compute_version_lt",
           "requires_package", "set_random_seed", "time_ms", "torch_assert_close"]


def main() -> None:
    """Run pytest on the module that calls this (``if __name__ == "__main__":
    tilews.testing.main()``), with the command line's arguments; exit with pytest's status."""
    import pytest
    test_file = inspect.getsourcefile(sys._getframe(1))
    sys.exit(pytest.main([test_file] + sys.argv[1:]))


def set_random_seed(seed: int = 42) -> None:
    """Seed Python's, numpy's and torch's random generators (``torch.manual_seed`` seeds every
    device's)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
