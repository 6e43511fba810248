"""The Gluon backend: warp-specialized Hopper (sm_90a) kernels.

It lowers for ``HOPPER`` (with the machine's SM count, for persistent grids) and refuses a program
whose lowering made an ``AsyncRefusal`` instead of an ``AsyncPlan`` (the next backend of the
chain, ``tl``, compiles it). Loading compiles the source for sm_90a (compile-only on a machine
without a GPU). Its output depends on the Triton version and on our TTGIR passes, both part of its
fingerprint.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from tilews.lowering import ir
from tilews.lowering.backend import Backend, Services
from tilews.lowering.plans import AsyncRefusal
from tilews.lowering.target import HOPPER

from ..toolchain import triton_version
from .emit import emit
from .launch import GluonProgram


class GluonBackend(Backend):
    name = "gluon"

    def refuses(self, lowered: ir.Kernel) -> Optional[str]:
        refusal = lowered.find_plan(AsyncRefusal)
        return None if refusal is None else refusal.reason

    def emit(self, lowered: ir.Kernel) -> str:
        return emit(lowered, self.target.fast_math)

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> GluonProgram:
        return GluonProgram(source, lowered, self.services.store, triton_version())

    def fingerprint(self) -> tuple:
        from tilews.triton_ext import passes as ttgir_passes
        return super().fingerprint() + (triton_version(), ttgir_passes.cache_key_part())


def make(services: Services) -> GluonBackend:
    return GluonBackend(dataclasses.replace(HOPPER, num_sms=services.machine.num_sms,
                                            overlap_softmax=services.settings.overlap_softmax), services)
