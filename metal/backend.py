"""The Metal backend: Tile IR -> Metal Shading Language, run on an Apple GPU or, elsewhere, on the CPU.

It lowers with the ``METAL`` target (one stream of threads; fragments placed by ``legalize_metal``,
block barriers by ``insert_syncs``), emits an ``MslKernel`` (``metal/emit.py``) and launches the
same kernel text on whatever holds the tensors (``metal/program.py``). Its source is the whole MSL
translation unit (``MslKernel.full_source``).
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.backend import Backend, Services
from tilews.lowering.errors import InternalError
from tilews.lowering.target import METAL

from .emit import emit
from .program import MetalProgram


class MetalBackend(Backend):
    name = "metal"

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


def make(services: Services) -> MetalBackend:
    return MetalBackend(METAL, services)
