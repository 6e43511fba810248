"""The decode workload: one query token per sequence against a KV cache of S keys, shapes
``BxHxKVHxSxD:mode`` (batch, query heads, KV heads, cache length, head dim):

* ``gqa``: ``tilews.ops.decode_attention`` (split-KV flash decoding, the split count its own
  heuristic's) on q [B, 1, H, D] and a dense cache [B, S, KVH, D];
* ``mla``: ``tilews.ops.mla_decode``, DeepSeek's latent attention: D is the latent dim (512),
  with a rope dim of 64; KVH must be 1 (the latent head both K and V).

FLOPs: the two matmuls, 4 * B * H * S * D (MLA: 2 * B * H * S * (D + 64) + 2 * B * H * S * D);
decoding is bound by reading the cache, so compare times more than TFLOP/s. Inputs are random
normal; the exact reference is float64 torch (einsum).

References, on a GPU, gqa only: SDPA on q [B, H, 1, D] with ``enable_gqa`` under each of its
backends that takes it (flash, efficient, cuDNN; forced with ``sdpa_kernel``, a backend that does
not take the shape says why: ``Unavailable``), and a plain torch flash decoding (split-KV in
torch ops: per-split scores, log-sum-exp, then the combine). mla: the same computation in torch
(einsum over the latent cache).

GPU commands: ``tilews-bench decode --targets hopper`` (the ``bench`` preset: batch 1-64, KV
4k-32k; ``--shapes mla`` for the MLA shapes), ``--quick`` for ``gpu-quick``.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import _sdpa_unavailable
from .shapes import Shape
from .workload import Case, Reference, Unavailable, Variant, Workload, standard_preset

MODES = ("gqa", "mla")
PE_DIM = 64
SPLIT = 1024            # keys per split of the torch flash-decoding reference
GQA = ((1, 32, 8, 8192, 128), (8, 32, 8, 8192, 128), (64, 32, 8, 4096, 128), (16, 32, 8, 32768, 128),
       (1, 64, 8, 32768, 128), (32, 32, 4, 16384, 64))
MLA = ((1, 128, 1, 8192, 512), (16, 128, 1, 8192, 512), (64, 128, 1, 4096, 512))
PRESETS = {
    "bench": tuple(s + ("gqa",) for s in GQA) + tuple(s + ("mla",) for s in MLA),   # the GPU default
    "gqa": tuple(s + ("gqa",) for s in GQA),
    "mla": tuple(s + ("mla",) for s in MLA),
    "gpu-quick": ((8, 32, 8, 8192, 128, "gqa"), (16, 128, 1, 8192, 512, "mla")),
    "cpu": ((2, 8, 2, 100, 64, "gqa"), (1, 64, 1, 70, 64, "mla")),    # ragged ends, interpreter sizes
}


def _mla(case: Case) -> bool:
    return case.shape[5] == "mla"


def _flops(shape: Shape) -> float:
    B, H, _, S, D, mode = shape
    return 2.0 * B * H * S * (D + PE_DIM) + 2.0 * B * H * S * D if mode == "mla" else 4.0 * B * H * S * D


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    B, H, KVH, S, D, _ = case.shape
    shapes = ([(B, H, D), (B, H, PE_DIM), (B, S, 1, D), (B, S, 1, PE_DIM)] if _mla(case)
              else [(B, 1, H, D), (B, S, KVH, D), (B, S, KVH, D)])
    return tuple(torch.randn(s, generator=gen, device=case.machine.device).to(case.dtype) for s in shapes)


def _make_output(case: Case) -> torch.Tensor:
    B, H, _, _, D, _ = case.shape
    shape = (B, H, D) if _mla(case) else (B, 1, H, D)
    return torch.empty(shape, dtype=case.dtype, device=case.machine.device)


def _reference(case: Case, *inputs: torch.Tensor) -> torch.Tensor:
    """float64 einsum: one batch at a time."""
    if _mla(case):
        return _torch_mla(*(t.double() for t in inputs))
    q, k, v = inputs
    return torch.stack([_torch_decode(q[b:b + 1].double(), k[b:b + 1].double(), v[b:b + 1].double())[0]
                        for b in range(q.shape[0])])


def _torch_decode(q, k, v):
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bshd->bhqs", q, k.repeat_interleave(group, 2)) * q.shape[-1] ** -0.5
    return torch.einsum("bhqs,bshd->bqhd", torch.softmax(s, -1), v.repeat_interleave(group, 2))


def _torch_mla(q, q_pe, kv, k_pe):
    s = (torch.einsum("bhd,bsd->bhs", q, kv[:, :, 0]) + torch.einsum("bhd,bsd->bhs", q_pe, k_pe[:, :, 0]))
    s = s * (q.shape[-1] + q_pe.shape[-1]) ** -0.5
    return torch.einsum("bhs,bsd->bhd", torch.softmax(s.float(), -1).to(kv.dtype), kv[:, :, 0])


# ---- tilews variant ----------------------------------------------------------------------------

def _build_tilews(case: Case, target: str):
    from tilews.ops import decode_attention, mla_decode
    if _mla(case):
        if case.shape[2] != 1:
            raise Unavailable("MLA has one latent KV head: write the shape with KVH = 1")
        return lambda q, q_pe, kv, k_pe, out: out.copy_(mla_decode(q, q_pe, kv, k_pe, target=target))
    return lambda q, k, v, out: out.copy_(decode_attention(q, k, v, target=target))


# ---- references --------------------------------------------------------------------------------

def _build_sdpa(backend: SDPBackend, case: Case):
    """SDPA on q [B, H, 1, D] and K / V [B, KVH, S, D] views with ``enable_gqa``, in
    ``sdpa_kernel(backend)``; a first call says whether the backend takes the shape."""
    B, H, KVH, S, D, _ = case.shape
    probe_q = torch.zeros(B, H, 1, D, dtype=case.dtype, device=case.machine.device)
    probe_kv = torch.zeros(B, KVH, S, D, dtype=case.dtype, device=case.machine.device)
    try:
        F.scaled_dot_product_attention(probe_q, probe_kv, probe_kv, enable_gqa=KVH != H)
    except RuntimeError as e:
        raise Unavailable(f"SDPA's {backend.name} backend does not take this shape: "
                          f"{' '.join(str(e).split())[:200]}") from e

    def run(q, k, v, out):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           enable_gqa=KVH != H)
        out.copy_(o.transpose(1, 2))
    return run


def sdpa_reference(name: str, backend: SDPBackend) -> Reference:
    return Reference(name, functools.partial(_build_sdpa, backend), runs_on=lambda m: name,
                     unavailable=functools.partial(_sdpa_unavailable, backend),
                     scope=functools.partial(sdpa_kernel, backend),
                     applies=lambda shape: shape[5] == "gqa")


def _build_torch_split(case: Case):
    """Flash decoding in torch ops: the cache in ``SPLIT``-key splits, each split's softmax output
    and log-sum-exp, then the splits combined by their weights."""
    def run(q, k, v, out):
        B, S, KVH, D = k.shape
        H = q.shape[2]
        qg = q.view(B, KVH, H // KVH, D).float()
        n = -(-S // SPLIT)
        kp = F.pad(k, (0, 0, 0, 0, 0, n * SPLIT - S)).view(B, n, SPLIT, KVH, D).float()
        vp = F.pad(v, (0, 0, 0, 0, 0, n * SPLIT - S)).view(B, n, SPLIT, KVH, D).float()
        s = torch.einsum("bhgd,bnshd->bnhgs", qg, kp) * D ** -0.5
        s = s.masked_fill((torch.arange(n * SPLIT, device=q.device) >= S).view(n, 1, 1, SPLIT), float("-inf"))
        lse = torch.logsumexp(s, -1)                                     # [B, n, KVH, g]
        part = torch.einsum("bnhgs,bnshd->bnhgd", torch.exp(s - lse[..., None]), vp)
        w = torch.softmax(lse, 1)
        out.copy_((part * w[..., None]).sum(1).reshape(B, 1, H, D))
    return run


def _build_torch_mla(case: Case):
    return lambda q, q_pe, kv, k_pe, o: o.copy_(_torch_mla(q, q_pe, kv, k_pe))


def _gpu_only(machine):
    return None if machine.gpu else "runs on a CUDA GPU only"


WORKLOAD = Workload(
    name="decode", dims=("B", "H", "KVH", "S", "D"), modes=MODES, presets=PRESETS,
    default_preset=standard_preset, flops=_flops, make_inputs=_make_inputs,
    make_output=_make_output, reference=_reference, tolerance=1e-2,
    variants=[Variant("tilews.ops decode", _build_tilews)],
    references=[sdpa_reference("SDPA flash", SDPBackend.FLASH_ATTENTION),
                sdpa_reference("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION),
                sdpa_reference("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                Reference("torch flash-decoding", _build_torch_split, runs_on=lambda m: "torch",
                          unavailable=_gpu_only, applies=lambda shape: shape[5] == "gqa"),
                Reference("torch MLA (einsum)", _build_torch_mla, runs_on=lambda m: "torch",
                          unavailable=_gpu_only, applies=lambda shape: shape[5] == "mla")])
