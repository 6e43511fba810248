"""The Metal backend: Tile IR -> Metal Shading Language, run on an Apple GPU or, elsewhere, on the CPU.

It lowers for Apple GPUs with its pipeline (one stream of threads; fragments placed by
``legalize_metal``, block barriers by ``insert_syncs``), emits an ``MslKernel`` (``metal/emit.py``) and launches the
same kernel text on whatever holds the tensors (``metal/program.py``). Its source is the whole MSL
translation unit (``MslKernel.full_source``).
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.backend import Backend, Machine
from tilews.lowering.capabilities import APPLE_GPU, Capabilities
from tilews.lowering.config import BackendConfig
from tilews.lowering.errors import InternalError
from tilews.lowering.passes import (despecialize, double_buffer, insert_syncs, legalize,
                                    legalize_metal, plan_buffers, swizzle_grid)
from tilews.lowering.pipeline import Pass, Phase, Pipeline

from .emit import emit
from .program import MetalProgram


PIPELINE = Pipeline((
    # First: T.ws roles become one stream (where source order satisfies their barriers).
    Phase("one stream", (Pass.of(despecialize),)),
    Phase("plan memory", (Pass.of(plan_buffers),)),
    Phase("legalize", (Pass.of(legalize),)),
    Phase("grid", (Pass.of(swizzle_grid),)),
    # Metal's choices, on the final program: where each fragment lives (registers, simdgroup
    # matrices, threadgroup memory), then a pipelined loop's next tiles loaded into second
    # shared buffers within the budget, then the block barriers between statements that share
    # memory across threads.
    Phase("place", (Pass.of(legalize_metal), Pass.of(double_buffer))),
    Phase("sync", (Pass.of(insert_syncs),)),
))


class MetalBackend(Backend):
    name = "metal"
    pipeline = PIPELINE

    @classmethod
    def capabilities(cls, machine: Machine) -> Capabilities:
        return APPLE_GPU

    def lower(self, kernel: ir.Kernel, observe=None) -> ir.Kernel:
        return super().lower(kernel, observe).with_note(_where_it_runs())

    def emit(self, lowered: ir.Kernel) -> str:
        return emit(lowered).full_source()

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> MetalProgram:
        msl = emit(lowered)
        if msl.full_source() != source:
            raise InternalError(f"metal backend: the emitted source of '{lowered.name}' changed "
                                f"between compile and load")
        return MetalProgram(msl, lowered)


    def fingerprint(self) -> tuple:
        return super().fingerprint() + (_where_it_runs(),)


def _where_it_runs() -> str:
    """The report's line on what executes the kernel on this machine."""
    import torch
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return ("metal: tensors on 'mps' run on this Mac's GPU through torch.mps; CPU tensors "
                "through the CPU harness")
    return ("metal: no Metal device here: calls run the MSL through the CPU harness (compiled as "
            "C++, one thread per lane): correct results, not Metal's speed")


METAL = BackendConfig(APPLE_GPU, PIPELINE)   # the backend's config without pass configs
