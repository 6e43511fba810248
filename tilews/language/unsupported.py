"""TileLang names ``tilews.language`` does not provide, each with the reason a program that
reaches one is told (``tilews.language.__getattr__``): inside a kernel a ``CompileError`` at the
user's line, elsewhere ``tilews.unprovided.NotProvided`` (an ``AttributeError``). TileLang's dtypes of fewer than
8 bits are names here (``T.int4 == "int4"``), so programs that only mention them import; a tensor
of one is refused where it is declared."""
from __future__ import annotations

from tilews.lowering.dtypes import SUB_BYTE_NAMES
from tilews.lowering.frontend import context, semantic
from tilews.unprovided import NotProvided

_INSTRUCTIONS = ("tilews chooses and issues the hardware instructions itself (T.gemm, T.copy, "
                 "T.Pipelined, T.ws); explicit ones are not provided")
_EXTERNAL_SOURCE = ("tilews compiles through Triton and Metal: CUDA source cannot be spliced into "
                    "a kernel")

REASONS = {
    "wgmma_gemm": _INSTRUCTIONS,
    "wait_wgmma": _INSTRUCTIONS,
    "ptx_cp_async": _INSTRUCTIONS,
    "cp_async_barrier_noinc": _INSTRUCTIONS,
    "fence_proxy_async": _INSTRUCTIONS,
    "tcgen05_gemm": _INSTRUCTIONS + " (and tcgen05 / tensor memory are Blackwell's)",
    "alloc_tmem": _INSTRUCTIONS + " (and tcgen05 / tensor memory are Blackwell's)",
    "sync_grid": "a grid-wide barrier is not supported: split the work into kernels",
    "im2col": "T.im2col is not provided yet: copy the patches with T.copy over computed indices",
    "gemm_sp": "structured-sparse T.gemm_sp is not provided",
    "device_assert": "device-side assertions are not provided yet",
    "alloc_buffer": "TVM's raw T.alloc_buffer is not provided: use T.alloc_shared, "
                    "T.alloc_fragment or T.alloc_local",
}


def missing(name: str):
    """What ``T.<name>`` gives for a name ``tilews.language`` lacks."""
    if name in SUB_BYTE_NAMES:
        return name
    reason = REASONS.get(name)
    if reason is None:
        raise AttributeError(f"module 'tilews.language' has no attribute {name!r}")
    message = f"T.{name} is TileLang's; tilews does not provide it: {reason}"
    if context.building():
        raise semantic.err(message)
    raise NotProvided(message)
