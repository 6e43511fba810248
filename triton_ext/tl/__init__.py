"""The ``triton.language`` backend: any Triton target, and Triton's CPU interpreter.

``backend.make(services)`` is the backend object (``tilews.lowering.backend.Backend``); ``emit``
alone needs no Triton (compile-only inspection); ``TlProgram.launch(values)`` runs a loaded kernel.
"""
from __future__ import annotations

from .emit import emit
from .launch import TlProgram, ensure_interpreter

__all__ = ["TlProgram", "emit", "ensure_interpreter"]
