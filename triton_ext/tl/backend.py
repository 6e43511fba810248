"""The ``triton.language`` backend: any Triton target, and Triton's CPU interpreter.

It builds for any Triton GPU where a GPU is visible and for Triton's CPU interpreter elsewhere,
as one stream of threads. Its output depends on the Triton version, which is part of its
fingerprint.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.backend import Backend, Machine
from tilews.lowering.capabilities import ANY_TRITON_GPU, TRITON_INTERPRETER, Capabilities
from tilews.lowering.config import BackendConfig
from tilews.lowering.passes import despecialize, legalize, longest_first, plan_buffers, swizzle_grid
from tilews.lowering.pipeline import Pass, Phase, Pipeline

from ..toolchain import triton_version
from .emit import emit
from .launch import TlProgram


PIPELINE = Pipeline((
    # First: T.ws roles become one stream (where source order satisfies their barriers), so
    # every later pass sees the program that runs.
    Phase("one stream", (Pass.of(despecialize),)),
    # The grid launches as it stands: the blocks with the longest pipelined loop (causal
    # attention's last query blocks) first, so short ones fill the tail.
    Phase("shape", (Pass.of(longest_first),)),
    Phase("plan memory", (Pass.of(plan_buffers),)),
    # Masks, f32 dot operands under the interpreter, power-of-two tiles, the stream's warps.
    Phase("legalize", (Pass.of(legalize),)),
    # Last: a swizzled grid's block indices become the panel order.
    Phase("grid", (Pass.of(swizzle_grid),)),
))


class TlBackend(Backend):
    name = "tl"
    pipeline = PIPELINE

    @classmethod
    def capabilities(cls, machine: Machine) -> Capabilities:
        return ANY_TRITON_GPU if machine.cuda else TRITON_INTERPRETER

    def emit(self, lowered: ir.Kernel) -> str:
        return emit(lowered, self.config.codegen.fast_math)

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> TlProgram:
        return TlProgram(source, lowered, self.services.store, self.config.caps.triton_interpreter)

    def fingerprint(self) -> tuple:
        return super().fingerprint() + (triton_version(),)


# the backend's configs without pass configs: on a GPU, and under Triton's CPU interpreter
TRITON_GPU = BackendConfig(ANY_TRITON_GPU, PIPELINE)
TRITON_CPU = BackendConfig(TRITON_INTERPRETER, PIPELINE)
