"""A pytest plugin for ``tilelang_suite.py run --cpu``: TileLang's example tests, written for a
CUDA GPU, run on a machine without one, on tilews's interpreter. A dry run for development (which
tests stop at a missing name or a refused declaration), never a measurement.

Loaded with ``-p suite_cpu_plugin`` (``scripts/`` on ``PYTHONPATH``), before the test modules
import, it makes:

* CUDA tensors CPU tensors: ``Tensor.cuda`` is the tensor itself, ``Tensor.to`` and the
  ``device=`` of torch's factory functions (``FACTORIES``) turn a CUDA device into the CPU;
* ``torch.cuda`` answer as one Hopper GPU (``is_available``, capability (9, 0), one device, its
  properties), its synchronizations and seeds do the CPU's, and ``torch.cuda.Event`` a wall clock;
* tilews's ``target="auto"`` (and TileLang's ``"cuda"``) choose ``"interpret"``, or the target
  named by ``SUITE_CPU_TARGET`` (``triton``: Triton's CPU interpreter).
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
import types

import torch

# torch functions the examples call with ``device=``
FACTORIES = ("randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "arange",
             "linspace", "eye", "tensor", "as_tensor", "empty_strided", "empty_like", "zeros_like",
             "ones_like", "full_like", "rand_like", "randn_like", "randint_like")

_PROPERTIES = types.SimpleNamespace(name="CPU (tilelang_suite --cpu)", major=9, minor=0,
                                    multi_processor_count=132, total_memory=80 << 30)


def _cpu(device):
    """``device`` with CUDA (a name, a ``torch.device`` or an index) replaced by the CPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
        return "cpu"
    return device


def _on_cpu(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return fn(*args, **kwargs)
    return wrapper


def _tensor_to(to):
    @functools.wraps(to)
    def wrapper(self, *args, **kwargs):
        args = tuple(_cpu(a) if isinstance(a, (str, int, torch.device)) else a for a in args)
        return _on_cpu(to)(self, *args, **kwargs)
    return wrapper


class _WallClockEvent:
    """``torch.cuda.Event`` read from the host's clock."""

    def __init__(self, *args, **kwargs):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end: _WallClockEvent) -> float:
        return (end.t - self.t) * 1e3


def _patch_torch() -> None:
    for name in FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.Tensor.to = _tensor_to(torch.Tensor.to)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: (9, 0)
    cuda.get_device_name = lambda device=None: _PROPERTIES.name
    cuda.get_device_properties = lambda device=None: _PROPERTIES
    cuda.synchronize = lambda device=None: None
    cuda.set_device = lambda device: None
    cuda.device = lambda device=None: contextlib.nullcontext()
    # the CPU generator's own seed (torch.manual_seed calls torch.cuda.manual_seed_all)
    cuda.manual_seed = cuda.manual_seed_all = torch.default_generator.manual_seed
    cuda.Event = _WallClockEvent


def pytest_configure(config):
    _patch_torch()
    import tilews.targets
    tilews.targets._machine_choice = lambda: os.environ.get("SUITE_CPU_TARGET", "interpret")
    # TileLang's target="cuda" asks for the GPU: here that is the interpreter too
    resolve = tilews.targets.resolve
    tilews.targets.resolve = lambda name: resolve("auto" if name == "cuda" else name)
