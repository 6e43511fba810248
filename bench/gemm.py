"""The GEMM workload: C = A @ B, bf16/fp16 in, fp32 accumulation, same dtype out.

tilews variant: ``examples.gemm.matmul`` rebuilt for each target. References: ``torch.matmul``
(cuBLAS on a GPU) and the plain Triton ``tl.dot`` kernel of ``tilews.bench.baselines``.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import torch

from .machine import Machine, triton_unavailable
from .workload import Case, Reference, Variant, Workload

SQUARE = ((4096, 4096, 4096), (8192, 8192, 8192))
SMALL_K = ((8192, 8192, 1024),)
LARGE_K = ((4096, 4096, 16384),)
RAGGED = ((1000, 1100, 1234), (4095, 4097, 4099), (513, 257, 129))
PRESETS = {
    "square": SQUARE,
    "small-k": SMALL_K,
    "large-k": LARGE_K,
    "ragged": RAGGED,
    "l2": ((1024, 1024, 1024), (2048, 2048, 512)),   # operands fit in L2: inputs rotate
    "bench": SQUARE + SMALL_K + LARGE_K + RAGGED,     # the GPU default (docs/measuring.md's set)
    "gpu-quick": ((4096, 4096, 4096), (1000, 1100, 1234)),
    "cpu": ((128, 128, 128), (200, 136, 100)),       # interpreter sizes, one of them ragged
}


def _default_preset(machine: Machine, quick: bool) -> str:
    if not machine.gpu:
        return "cpu"
    return "gpu-quick" if quick else "bench"


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    M, N, K = case.shape
    dev = case.machine.device
    a = torch.randn(M, K, generator=gen, device=dev).to(case.dtype)
    b = torch.randn(K, N, generator=gen, device=dev).to(case.dtype)
    return a, b


def _make_output(case: Case) -> torch.Tensor:
    M, N, _ = case.shape
    return torch.empty(M, N, dtype=case.dtype, device=case.machine.device)


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double()


# ---- tilews variants ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _factory(target: str):
    """``examples.gemm.matmul`` for ``target``, writing into a caller-given C (no out_idx)."""
    import tilews
    return tilews.jit(target=target)(_example_gemm().matmul.fn)


def _example_gemm():
    """``examples/gemm.py``: importable from a checkout's root, else loaded from the checkout this
    bench lives in (an installed ``tilews-bench`` run from elsewhere)."""
    try:
        import examples.gemm
        return examples.gemm
    except ImportError:
        path = Path(__file__).resolve().parents[1] / "examples" / "gemm.py"
        if not path.exists():
            raise ImportError(f"tilews's GEMM kernel (examples/gemm.py) is not at {path}; run the "
                              f"bench from a tilews checkout") from None
        spec = importlib.util.spec_from_file_location("examples.gemm", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


def _tilews_dtype(case: Case):
    import tilews.language as T
    return {torch.bfloat16: T.bfloat16, torch.float16: T.float16}[case.dtype]


def persistent_variant(block_M: int, block_N: int, block_K: int, num_stages: int, threads: int) -> Variant:
    """``examples.gemm.persistent_matmul``: one block per SM over output tiles."""
    def build(case: Case, target: str):
        import tilews
        factory = tilews.jit(target=target)(_example_gemm().persistent_matmul.fn)
        return factory(*case.shape, block_M=block_M, block_N=block_N, block_K=block_K,
                       num_stages=num_stages, threads=threads, dtype=_tilews_dtype(case))
    return Variant(f"tilews persistent {block_M}x{block_N}x{block_K} s{num_stages} t{threads}", build)


def tilews_variant(block_M: int, block_N: int, block_K: int, num_stages: int,
                   threads: int = 128, swizzle: int = 0) -> Variant:
    def build(case: Case, target: str):
        return _factory(target)(*case.shape, block_M=block_M, block_N=block_N, block_K=block_K,
                                num_stages=num_stages, threads=threads, swizzle=swizzle,
                                dtype=_tilews_dtype(case))
    suffix = ("" if threads == 128 else f" t{threads}") + (f" sw{swizzle}" if swizzle else "")
    return Variant(f"tilews {block_M}x{block_N}x{block_K} s{num_stages}{suffix}", build)


# ---- references --------------------------------------------------------------------------------

def _torch_matmul(case: Case):
    return lambda a, b, c: torch.matmul(a, b, out=c)


def _triton_matmul(case: Case):
    from . import baselines
    return baselines.matmul


TORCH = Reference("torch.matmul", _torch_matmul,
                  runs_on=lambda m: "cuBLAS" if m.gpu else "torch CPU")
TRITON = Reference("triton tl.dot", _triton_matmul,
                   runs_on=lambda m: "triton" if m.gpu else "triton CPU interpreter",
                   unavailable=triton_unavailable)

WORKLOAD = Workload(
    name="gemm", dims="MNK", presets=PRESETS, default_preset=_default_preset,
    flops=lambda s: 2.0 * s[0] * s[1] * s[2],
    make_inputs=_make_inputs, make_output=_make_output, reference=_reference,
    tolerance=1e-2,
    # 128 threads: one consumer warp group; on a GPU also 128x256 tiles over 256 threads, two
    # consumer warp groups (on Hopper, plus the producer warp group warp specialization adds)
    variants=[tilews_variant(128, 128, 64, 3)]
    + ([tilews_variant(128, 256, 64, 3, threads=256, swizzle=16),
        persistent_variant(128, 256, 64, 3, threads=256)] if torch.cuda.is_available() else []),
    references=[TORCH, TRITON])
