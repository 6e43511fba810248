"""The attention backward workload (``tilews-bench attention --backward``): dq, dk and dv of
softmax(Q K^T / sqrt(D)) V given dO, bf16/fp16 [B, H, S, D] (BHSD), causal or not — the shapes,
presets and modes of the forward workload (``bench/attention.py``).

FLOPs: FlashAttention's convention for the backward, 2.5x the forward's (five matmuls to its two):
10 * B * H * S * S * D, halved when causal. The output is the three gradients stacked
([3, B, H, S, D]); every kernel (tilews's and the references) copies its gradients into it, so
the copy is in every row's time. The exact reference is float64 SDPA's autograd, a few (batch,
head) pairs at a time.

Each timed call is the backward alone: the forward (tilews's, which keeps the log-sum-exp; SDPA's
graph for the references) runs once per inputs when the kernel first sees them.

tilews variant: ``tilews.ops.attention``'s backward kernels (``attention_backward.kernels``)
compiled for each target, after its forward compiled for the same target.
References, on a GPU: SDPA's backward with its cuDNN and flash backends.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import MODES, PRESETS, REFERENCE_SCORES_BYTES, _causal, _sdpa_unavailable
from .attention import _flops as forward_flops
from .kernels import for_target
from .workload import Case, Reference, Unavailable, Variant, Workload, standard_preset


def _flops(shape) -> float:
    return 2.5 * forward_flops(shape)


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(case.shape[:4], generator=gen, device=case.machine.device).to(case.dtype)
                 for _ in range(4))                                    # q, k, v, dO


def _make_output(case: Case) -> torch.Tensor:
    return torch.empty((3, *case.shape[:4]), dtype=case.dtype, device=case.machine.device)


def _reference(case: Case, q, k, v, do) -> torch.Tensor:
    """float64 SDPA's gradients, a chunk of (batch, head) pairs at a time."""
    B, H, S, D = q.shape
    per = max(1, REFERENCE_SCORES_BYTES // (S * S * 8))
    flat = [t.reshape(B * H, S, D) for t in (q, k, v, do)]
    out = torch.empty(3, B * H, S, D, dtype=torch.float64, device=q.device)
    for i in range(0, B * H, per):
        qq, kk, vv = (t[i:i + per].double().requires_grad_() for t in flat[:3])
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=_causal(case))
        out[:, i:i + per] = torch.stack(torch.autograd.grad(o, (qq, kk, vv), flat[3][i:i + per].double()))
    return out.reshape(3, B, H, S, D)


def _once_per_inputs(forward):
    """A kernel fn running ``forward(q, k, v)`` -> backward(do) the first time it sees these
    inputs, and only the backward afterwards; the gradients are copied into ``out``."""
    state: dict = {}

    def run(q, k, v, do, out):
        key = tuple(t.data_ptr() for t in (q, k, v))
        if state.get("key") != key:
            state.update(key=key, backward=forward(q, k, v))
        for dst, g in zip(out, state["backward"](do)):
            dst.copy_(g)
        return out
    return run


def _build_tilews(case: Case, target: str):
    from tilews.lowering.dtypes import from_torch
    from tilews.ops.attention import blocks, lse_rows, mha_fwd_lse
    from tilews.ops.attention_backward import attention_backward
    B, H, S, D, _ = case.shape
    causal, fwd_blocks = _causal(case), blocks(D, case.machine.gpu)
    fwd = for_target(mha_fwd_lse.fn, target)(B, H, S, D, causal, dtype=from_torch(case.dtype),
                                              **fwd_blocks)

    def forward(q, k, v):
        o = torch.empty_like(q)
        lse = torch.empty((B, H, lse_rows(S, fwd_blocks["block_M"])), device=q.device)
        fwd(q, k, v, o, lse)
        return lambda do: attention_backward(do, q, k, v, o, lse, causal, "bhsd", target=target)
    return _once_per_inputs(forward)


def _build_sdpa(backend: SDPBackend, case: Case):
    causal = _causal(case)

    def forward(q, k, v):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        try:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        except RuntimeError as e:
            raise Unavailable(f"SDPA's {backend.name} backend does not take this shape: {e}") from e
        return lambda do: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return _once_per_inputs(forward)


def _sdpa_backward(name: str, backend: SDPBackend, runs_on: str) -> Reference:
    return Reference(name, functools.partial(_build_sdpa, backend), runs_on=lambda m: runs_on,
                     unavailable=functools.partial(_sdpa_unavailable, backend),
                     scope=functools.partial(sdpa_kernel, backend))


WORKLOAD = Workload(
    name="attention-backward", dims="BHSD", modes=MODES, presets=PRESETS,
    default_preset=standard_preset, flops=_flops, make_inputs=_make_inputs,
    make_output=_make_output, reference=_reference, tolerance=1e-2,
    variants=[Variant("tilews.ops.attention backward", _build_tilews)],
    references=[_sdpa_backward("SDPA cuDNN backward", SDPBackend.CUDNN_ATTENTION, "cuDNN"),
                _sdpa_backward("SDPA flash backward", SDPBackend.FLASH_ATTENTION, "FlashAttention-2")])
