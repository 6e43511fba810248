"""The ``triton.language`` backend: any Triton target, and Triton's CPU interpreter.

It builds for ``TRITON_GPU`` where a GPU is visible and for ``TRITON_CPU`` (Triton's interpreter)
elsewhere. Its output depends on the Triton version, which is part of its fingerprint.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.backend import Backend, Services
from tilews.lowering.target import TRITON_CPU, TRITON_GPU

from ..toolchain import triton_version
from .emit import emit
from .launch import TlProgram


class TlBackend(Backend):
    name = "tl"

    def emit(self, lowered: ir.Kernel) -> str:
        return emit(lowered, self.target.fast_math)

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> TlProgram:
        return TlProgram(source, lowered, self.services.store, self.target.triton_interpreter)

    def fingerprint(self) -> tuple:
        return super().fingerprint() + (triton_version(),)


def make(services: Services) -> TlBackend:
    return TlBackend(TRITON_GPU if services.machine.cuda else TRITON_CPU, services)
