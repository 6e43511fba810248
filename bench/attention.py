"""The attention workload: forward softmax(Q K^T / sqrt(D)) V, bf16/fp16 Q, K, V and output of
shape [B, H, S, D] (BHSD), causal or not: the shape's mode (``4x32x4096x128:causal``; a shape
without one runs both).

FLOPs: FlashAttention's convention, 4 * B * H * S * S * D (the two matmuls), halved when causal.
Inputs are random normal. The exact reference is float64
``torch.nn.functional.scaled_dot_product_attention`` on the upcast inputs (on a GPU too: a few
(batch, head) pairs at a time, so its S x S float64 scores stay near 1 GiB).

tilews variant: ``tilews.ops.attention``'s kernel (``mha_fwd``) rebuilt for each target, with the
blocks ``tilews.ops.attention.blocks`` gives: 128 x 128 blocks, 2 K/V stages over 256 threads on a GPU
(128 x 64 in one stage above D = 128), 64 x 64 over 128 threads on the CPU.

Second tilews variant: ``examples/attention.py``'s ``ws_mha_fwd_program``, the same
computation with the schedule written out by the user (``T.ws`` producer and two consumers, their
barriers), at the same blocks (issue 41: what an explicit program a user writes runs at).

References, on a GPU only: SDPA with its cuDNN backend and with its flash backend
(FlashAttention-2), each forced with ``torch.nn.attention.sdpa_kernel``. Entering that context
costs ~10 us of Python, as much as a short kernel, so it is entered around the reference's build,
check and each whole timing (``Reference.scope``), never per call. A backend that does not take a
shape or dtype makes that row say so (``Unavailable``, with torch's reasons), not fail.
"""
from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilews.lowering.dtypes import from_torch

from .kernels import example, for_target
from .machine import Machine
from .shapes import Shape, with_modes
from .workload import Case, Reference, Unavailable, Variant, Workload, standard_preset

MODES = ("causal", "noncausal")
BENCH = ((4, 32, 4096, 128), (2, 16, 16384, 128), (8, 16, 2048, 64), (16, 16, 1024, 128))
PRESETS = {
    "bench": with_modes(BENCH, MODES),                          # the GPU default
    "long": with_modes(((2, 16, 16384, 128),), MODES),
    "d64": with_modes(((8, 16, 2048, 64),), MODES),
    "gpu-quick": ((4, 32, 4096, 128, "causal"), (8, 16, 2048, 64, "noncausal")),
    "cpu": with_modes(((1, 2, 100, 64),), MODES),   # interpreter sizes; S = 100 masks a ragged end
}
REFERENCE_SCORES_BYTES = 2**30     # float64 S x S scores per chunk of the exact reference


def _causal(case: Case) -> bool:
    return case.shape[4] == "causal"


def _flops(shape: Shape) -> float:
    B, H, S, D, mode = shape
    return 4.0 * B * H * S * S * D / (2 if mode == "causal" else 1)


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(case.shape[:4], generator=gen, device=case.machine.device).to(case.dtype)
                 for _ in range(3))


def _make_output(case: Case) -> torch.Tensor:
    return torch.empty(case.shape[:4], dtype=case.dtype, device=case.machine.device)


def _reference(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float64 SDPA, a chunk of (batch, head) pairs at a time."""
    B, H, S, D = q.shape
    per = max(1, REFERENCE_SCORES_BYTES // (S * S * 8))
    q, k, v = (t.reshape(B * H, S, D) for t in (q, k, v))
    out = torch.empty(B * H, S, D, dtype=torch.float64, device=q.device)
    for i in range(0, B * H, per):
        out[i:i + per] = F.scaled_dot_product_attention(
            *(t[i:i + per].double() for t in (q, k, v)), is_causal=_causal(case))
    return out.reshape(B, H, S, D)


# ---- tilews variant ----------------------------------------------------------------------------

def _build_tilews(case: Case, target: str):
    """``mha_fwd`` for ``target``, writing into a caller-given output (no out_idx)."""
    from tilews.ops.attention import blocks, mha_fwd
    B, H, S, D, _ = case.shape
    return for_target(mha_fwd.fn, target)(B, H, S, D, _causal(case), layout="bhsd",
                                          dtype=from_torch(case.dtype), **blocks(D, case.machine.gpu))


def _build_explicit(case: Case, target: str):
    """``examples/attention.py``'s ``ws_mha_fwd_program`` (the schedule written out with ``T.ws``
    roles and barriers, as a user writes it) at the op's blocks for ``target``."""
    from tilews.ops.attention import blocks
    B, H, S, D, _ = case.shape
    chosen = blocks(D, case.machine.gpu)
    return for_target(example("attention").ws_mha_fwd_program, target)(
        B, H, S, D, _causal(case), block_M=chosen["block_M"], block_N=chosen["block_N"],
        stages=chosen["num_stages"], dtype=from_torch(case.dtype))


def _with_roles(target: str, machine: Machine) -> Optional[str]:
    """Where the explicit program cannot run: a target without warp specialization runs its roles
    one after another, and its producer then waits on a release its consumers give later (a
    ring of fewer stages than key blocks)."""
    if target in ("interpret", "hopper"):
        return None
    return (f"the explicit T.ws program's K/V ring needs its roles to run at once: target "
            f"'{target}' has no warp specialization (hopper and interpret do)")


# ---- references --------------------------------------------------------------------------------

def _build_sdpa(backend: SDPBackend, case: Case):
    """SDPA on this case's inputs (in ``sdpa_kernel(backend)``: the reference's scope). A first
    call on zeros of the case's shape finds out whether the backend takes it; torch says why not
    only in warnings, which go into the row's message."""
    causal = _causal(case)
    probe = torch.zeros(case.shape[:4], dtype=case.dtype, device=case.machine.device)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            F.scaled_dot_product_attention(probe, probe, probe, is_causal=causal)
        except RuntimeError as e:
            why = " ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in seen)) or str(e)
            raise Unavailable(f"SDPA's {backend.name} backend does not take this shape and dtype: "
                              f"{why}") from e
    return lambda q, k, v, out: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _sdpa_unavailable(backend: SDPBackend, machine: Machine):
    if not machine.gpu:
        return f"SDPA's {backend.name} backend runs on a CUDA GPU only"
    if backend == SDPBackend.CUDNN_ATTENTION and not torch.backends.cudnn.is_available():
        return "this torch has no cuDNN"
    return None


def sdpa_reference(name: str, backend: SDPBackend, runs_on: str) -> Reference:
    """SDPA forced to ``backend``: only it enabled, for the reference's whole build, check and timing."""
    return Reference(name, functools.partial(_build_sdpa, backend), runs_on=lambda m: runs_on,
                     unavailable=functools.partial(_sdpa_unavailable, backend),
                     scope=functools.partial(sdpa_kernel, backend))


WORKLOAD = Workload(
    name="attention", dims="BHSD", modes=MODES, presets=PRESETS, default_preset=standard_preset,
    flops=_flops, make_inputs=_make_inputs, make_output=_make_output, reference=_reference,
    tolerance=1e-2,
    variants=[Variant("tilews.ops.attention", _build_tilews),
              Variant("tilews explicit T.ws (examples/attention.py)", _build_explicit, _with_roles)],
    references=[sdpa_reference("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION, "cuDNN"),
                sdpa_reference("SDPA flash", SDPBackend.FLASH_ATTENTION, "FlashAttention-2")])
