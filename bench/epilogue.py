"""The GEMM-with-epilogue workload: C = act(alpha * A @ B + bias), bf16/fp16 in, fp32
accumulation, same dtype out; act is relu, gelu (its tanh form) or silu, the shape's mode
(``4096x4096x4096:gelu``; a shape without one runs all three).

alpha = 1 / sqrt(K), so alpha * A @ B is about unit normal and the activation's curved part
around 0 is exercised, not only its linear tails. FLOPs: the GEMM's 2 * M * N * K (the epilogue's
elementwise work is not counted). Inputs and the float64 exact reference reuse the GEMM
workload's A and B, plus a random normal bias [N].

tilews variant: ``tilews.ops.epilogue.matmul_epilogue`` rebuilt for each target, with the blocks
``tilews.ops.matmul_bias_act`` picks (128x256x64 over 256 threads on a GPU, 64x64x32 over 128 on
the CPU). Reference: ``torch.matmul`` followed by the same epilogue in eager PyTorch (alpha, bias
and the activation each a separate kernel), as a PyTorch user writes it: cuBLAS on a GPU.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from tilews.lowering.dtypes import from_torch

from . import gemm
from .kernels import for_target
from .shapes import with_modes
from .workload import Case, Reference, Variant, Workload, standard_preset

ACTIVATIONS = {"relu": F.relu, "gelu": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu}
MODES = tuple(ACTIVATIONS)
LLM = ((4096, 14336, 4096),)          # an LLM MLP's up projection: 4096 tokens, 4096 -> 14336
PRESETS = {
    "square": with_modes(((4096, 4096, 4096),), MODES),
    "small-k": with_modes(gemm.SMALL_K, MODES),
    "llm": with_modes(LLM, MODES),
    "bench": with_modes(((4096, 4096, 4096),) + gemm.SMALL_K + LLM, MODES),   # the GPU default
    "gpu-quick": with_modes(((4096, 4096, 4096),), MODES),
    "cpu": with_modes(gemm.PRESETS["cpu"], MODES),    # interpreter sizes, one of them ragged
}


def _alpha(K: int) -> float:
    return 1.0 / math.sqrt(K)


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    a, b = gemm.make_inputs(case, gen)
    bias = torch.randn(case.shape[1], generator=gen, device=case.machine.device).to(case.dtype)
    return a, b, bias


def _epilogue(case: Case, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """act(alpha * x + bias), in x's dtype: the exact reference's and PyTorch's epilogue."""
    _, _, K, act = case.shape
    return ACTIVATIONS[act](x * _alpha(K) + bias)


def _reference(case: Case, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _epilogue(case, a.double() @ b.double(), bias.double())


# ---- tilews variant ----------------------------------------------------------------------------

def _build_tilews(case: Case, target: str):
    """``matmul_epilogue`` for ``target``, writing into a caller-given C (no out_idx)."""
    from tilews.ops.epilogue import blocks, matmul_epilogue
    M, N, K, act = case.shape
    return for_target(matmul_epilogue.fn, target)(M, N, K, act, _alpha(K), dtype=from_torch(case.dtype),
                                                  **blocks(case.machine.gpu))


# ---- reference ---------------------------------------------------------------------------------

def _torch_epilogue(case: Case):
    return lambda a, b, bias, out: _epilogue(case, torch.matmul(a, b), bias)


TORCH = Reference("torch.matmul + epilogue", _torch_epilogue,
                  runs_on=lambda m: "cuBLAS + torch" if m.gpu else "torch CPU")

WORKLOAD = Workload(
    name="epilogue", dims="MNK", modes=MODES, presets=PRESETS, default_preset=standard_preset,
    flops=gemm.flops,
    make_inputs=_make_inputs, make_output=gemm.make_output, reference=_reference,
    tolerance=1e-2,
    variants=[Variant("tilews.ops.matmul_bias_act", _build_tilews)],
    references=[TORCH])
