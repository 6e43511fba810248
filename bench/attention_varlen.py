"""The varlen attention workload (``tilews-bench attention --varlen``): ``tilews.ops.attention_varlen``
on B packed sequences of S tokens each (q, k, v [B * S, H, D], ``cu_seqlens`` 0, S, 2S, ...),
against the dense kernels on the same tokens — issue 40's comparison, varlen at the same total
tokens as dense. The shapes, presets and modes are the forward workload's (``bench/attention.py``).

Equal lengths make the dense kernels compute exactly what varlen does, so every row is checked
against one float64 reference and the ratios are the varlen kernel's own overhead (reading its
offsets, masking to its sequence, no persistent schedule); ragged lengths are
``scripts/probe_attention_varlen.py``'s (they do less work than the dense batch of the same tokens).

The tilews variant runs on the target ``tilews.ops.attention_varlen`` picks (the machine's).
References: ``tilews.ops.attention`` (dense, BSHD views of the same tensors), and on a GPU SDPA's
cuDNN and flash backends on the [B, H, S, D] views.
"""
from __future__ import annotations

import functools

import torch
from torch.nn.attention import SDPBackend

from .attention import MODES, PRESETS, _build_sdpa, _causal, _flops, sdpa_reference
from .attention import _reference as _dense_reference
from .workload import Case, Reference, Variant, Workload, standard_preset


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    B, H, S, D, _ = case.shape
    return tuple(torch.randn((B * S, H, D), generator=gen, device=case.machine.device).to(case.dtype)
                 for _ in range(3))


def _make_output(case: Case) -> torch.Tensor:
    B, H, S, D, _ = case.shape
    return torch.empty((B * S, H, D), dtype=case.dtype, device=case.machine.device)


def _bhsd(case: Case, t: torch.Tensor) -> torch.Tensor:
    """A packed [B * S, H, D] tensor as its [B, H, S, D] view."""
    B, H, S, D, _ = case.shape
    return t.view(B, S, H, D).transpose(1, 2)


def _packed(case: Case, t: torch.Tensor) -> torch.Tensor:
    B, H, S, D, _ = case.shape
    return t.transpose(1, 2).reshape(B * S, H, D)


def _reference(case: Case, q, k, v) -> torch.Tensor:
    return _packed(case, _dense_reference(case, *(_bhsd(case, t) for t in (q, k, v))))


def _unavailable(target: str, machine) -> str | None:
    from tilews import targets
    here = targets.resolve("auto")[0]
    return None if target == here else f"the op compiles for this machine's target, '{here}'"


def _build_tilews(case: Case, target: str):
    from tilews.ops import attention_varlen
    B, H, S, D, _ = case.shape
    cu = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device=case.machine.device)
    causal = _causal(case)
    return lambda q, k, v, out: out.copy_(attention_varlen(q, k, v, cu, cu, S, S, causal=causal))


def _build_dense(case: Case):
    from tilews.ops import attention
    causal = _causal(case)
    return lambda q, k, v, out: _packed(case, attention(*(_bhsd(case, t) for t in (q, k, v)),
                                                      is_causal=causal))


def _on_views(build):
    """A dense reference's kernel on the [B, H, S, D] views of the packed inputs."""
    def built(case: Case):
        fn = build(case)
        return lambda q, k, v, out: _packed(case, fn(*(_bhsd(case, t) for t in (q, k, v)), out))
    return built


def _sdpa(name: str, backend: SDPBackend, runs_on: str) -> Reference:
    ref = sdpa_reference(name, backend, runs_on)
    return Reference(ref.name, _on_views(functools.partial(_build_sdpa, backend)), runs_on=ref.runs_on,
                     unavailable=ref.unavailable, scope=ref.scope)


WORKLOAD = Workload(
    name="attention-varlen", dims="BHSD", modes=MODES, presets=PRESETS,
    default_preset=standard_preset, flops=_flops, make_inputs=_make_inputs,
    make_output=_make_output, reference=_reference, tolerance=1e-2,
    variants=[Variant("tilews.ops.attention_varlen", _build_tilews, unavailable=_unavailable)],
    references=[Reference("tilews.ops.attention (dense)", _build_dense,
                          runs_on=lambda m: "tilews (dense)", interpreted=lambda m: not m.gpu),
                _sdpa("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION, "cuDNN"),
                _sdpa("SDPA flash", SDPBackend.FLASH_ATTENTION, "FlashAttention-2")])
