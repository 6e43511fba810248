"""The Gluon backend: warp-specialized Hopper (sm_90a) kernels.

``backend.make(services)`` is the backend object (``tilews.lowering.backend.Backend``); ``emit``
alone needs no Triton; ``GluonProgram`` compiles emitted source for sm_90a (compile-only, in a
child process: ``.asm`` works without a GPU) and launches it on an H100/H200.
"""
from __future__ import annotations

from .emit import emit
from .launch import GluonProgram

__all__ = ["GluonProgram", "emit"]
