"""The GEMM workload: C = A @ B, bf16/fp16 in, fp32 accumulation, same dtype out.

tilews variants: the user's program, ``examples.gemm.matmul`` (and on a GPU its persistent
form), rebuilt for each target; and the ready-made op ``tilews.ops.matmul`` run by
``tilews.ops.run`` with the schedule its heuristic picks for the shape's M bucket, as an untuned
call does (``tilews.ops.matmul (heuristic)``), and with the one ``tilews.ops.tune`` finds on this
shape, tuned once when the kernel is built (``tilews.ops.matmul (tuned)``; on the CPU interpreter,
where tuning is slow, only when ``TILEWS_TUNE=1`` asks for it, else the row is N/A). The op
compiles for the target it picks itself (``auto`` on a GPU, ``interpret`` on the CPU), so its rows
run on that target only. On target hopper also the schedules written out with ``T.ws`` roles and
barriers (``examples/ws_gemm.py``: one handshake, a ring, ping-pong). Presets: ``decode`` (M 1-16,
N and K 4096 or 14336), ``llm``, ``ragged``, ... (``PRESETS``). References: ``torch.matmul`` (cuBLAS on a GPU) and the plain Triton
``tl.dot`` kernel of ``tilews.bench.baselines``; with the metal target also ``mlx.core.matmul``
and ``torch.mm`` on MPS (``tilews.bench.apple_gpu``; on a Mac only). Metal has 32 KB of
threadgroup memory, too little for the CUDA-sized tiles: target metal runs a 64x64x32 variant
of the user's program instead.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from tilews.lowering.dtypes import from_torch

from . import apple_gpu
from .kernels import example, for_target
from .machine import Machine, mlx_unavailable, mps_unavailable, triton_unavailable
from .shapes import Shape
from .workload import Case, Reference, Unavailable, Variant, Workload, standard_preset

SQUARE = ((4096, 4096, 4096), (8192, 8192, 8192))
SMALL_K = ((8192, 8192, 1024),)
LARGE_K = ((4096, 4096, 16384),)
RAGGED = ((1000, 1100, 1234), (513, 257, 129), (777, 512, 4096), (4095, 4097, 4099))
# an LLM's projections (4096 -> 4096, the MLP's 4096 -> 14336 and back) at every token count M
LLM = tuple((M, N, K) for M in (1, 16, 32, 128, 512, 2048, 8192)
            for N, K in ((4096, 4096), (14336, 4096), (4096, 14336)))
# one token to a few per sequence (decoding) at N, K in {4096, 14336}: GEMV-class products
DECODE = tuple((M, N, K) for M in (1, 4, 8, 16) for N in (4096, 14336) for K in (4096, 14336))
PRESETS = {
    "square": SQUARE,
    "small-k": SMALL_K,
    "large-k": LARGE_K,
    "ragged": RAGGED,
    "llm": LLM,
    "l2": ((1024, 1024, 1024), (2048, 2048, 512)),   # operands fit in L2: inputs rotate
    "bench": SQUARE + SMALL_K + LARGE_K + RAGGED,     # the GPU default (docs/measuring.md's set)
    "gpu-quick": ((4096, 4096, 4096), (1000, 1100, 1234)),
    "decode": DECODE,
    "cpu": ((128, 128, 128), (200, 136, 100)),       # interpreter sizes, one of them ragged
}


def make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A [M, K] and B [K, N], random normal (a shape's first three dimensions: the epilogue
    workload's shapes end with an activation)."""
    M, N, K = case.shape[:3]
    dev = case.machine.device
    a = torch.randn(M, K, generator=gen, device=dev).to(case.dtype)
    b = torch.randn(K, N, generator=gen, device=dev).to(case.dtype)
    return a, b


def flops(shape: Shape) -> float:
    """2 * M * N * K (a shape's first three dimensions)."""
    M, N, K = shape[:3]
    return 2.0 * M * N * K


def make_output(case: Case) -> torch.Tensor:
    M, N, _ = case.shape[:3]
    return torch.empty(M, N, dtype=case.dtype, device=case.machine.device)


def _reference(case: Case, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double()


# ---- tilews variants ---------------------------------------------------------------------------

def example_gemm():
    """``examples/gemm.py`` (the user's GEMM programs)."""
    return example("gemm")


def persistent_variant(block_M: int, block_N: int, block_K: int, num_stages: int, threads: int) -> Variant:
    """``examples.gemm.persistent_matmul``: one block per SM over output tiles."""
    def build(case: Case, target: str):
        factory = for_target(example_gemm().persistent_matmul.fn, target)
        return factory(*case.shape, block_M=block_M, block_N=block_N, block_K=block_K,
                       num_stages=num_stages, threads=threads, dtype=from_torch(case.dtype))
    return Variant(f"tilews persistent {block_M}x{block_N}x{block_K} s{num_stages} t{threads}", build,
                   _not_on_metal)


def tilews_variant(block_M: int, block_N: int, block_K: int, num_stages: int,
                   threads: int = 128, swizzle: int = 0,
                   unavailable: Optional[Callable[[str, Machine], Optional[str]]] = None) -> Variant:
    """``examples.gemm.matmul`` for each target, writing into a caller-given C (no out_idx);
    ``unavailable`` (default: on every target but metal) as ``Variant``'s."""
    def build(case: Case, target: str):
        return for_target(example_gemm().matmul.fn, target)(
            *case.shape, block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages,
            threads=threads, swizzle=swizzle, dtype=from_torch(case.dtype))
    suffix = ("" if threads == 128 else f" t{threads}") + (f" sw{swizzle}" if swizzle else "")
    return Variant(f"tilews {block_M}x{block_N}x{block_K} s{num_stages}{suffix}", build,
                   unavailable or _not_on_metal)


def explicit_variant(program: str, label: str, **blocks) -> Variant:
    """A program of ``examples/ws_gemm.py`` (the schedule written out with ``T.ws`` roles and
    barriers) at its own defaults but ``blocks``, on target hopper only."""
    def build(case: Case, target: str):
        factory = for_target(getattr(example("ws_gemm"), program), target)
        return factory(*case.shape[:3], dtype=from_torch(case.dtype), **blocks)
    return Variant(f"tilews explicit T.ws, {label}", build, _hopper_only)


def _hopper_only(target: str, machine: Machine) -> Optional[str]:
    return None if target == "hopper" else "written for Hopper's warp specialization: target hopper only"


def _not_on_metal(target: str, machine: Machine) -> Optional[str]:
    return ("sized for a CUDA GPU: its tiles need more than Metal's 32 KB of threadgroup memory "
            "(target metal runs the Metal-sized variant)" if target == "metal" else None)


def _metal_only(target: str, machine: Machine) -> Optional[str]:
    return None if target == "metal" else "sized for Metal's 32 KB of threadgroup memory: target metal only"


def ops_variant(tuned: bool) -> Variant:
    """``tilews.ops.run`` with the heuristic's schedule, or with ``tilews.ops.tune``'s winner."""
    def build(case: Case, target: str):
        try:
            from tilews.ops import run, schedule, tune
        except ImportError as e:
            raise Unavailable(f"this tilews has no tilews.ops.matmul ({e})") from None
        if tuned:
            chosen = _tune(tune, case)
        else:
            import tilews
            M, N, K = case.shape[:3]
            chosen = schedule.heuristic(schedule.bucket(M), N, K, case.dtype, case.dtype, tilews.num_sms(),
                                        case.machine.gpu)
        def call(a, b, out):
            return run(a, b, out.dtype, chosen)
        call.note = str(chosen)
        return call
    return Variant(f"tilews.ops.matmul ({'tuned' if tuned else 'heuristic'})", build, _ops_unavailable)


def ops_target(machine: Machine) -> str:
    """The target ``tilews.ops.matmul`` compiles for here: ``auto``'s on a GPU, else ``interpret``."""
    from tilews import targets
    return targets.resolve("auto")[0] if machine.gpu else "interpret"


def _ops_unavailable(target: str, machine: Machine) -> Optional[str]:
    here = ops_target(machine)
    return None if target == here else f"tilews.ops.matmul compiles for the target it picks: '{here}' here"


def _tune(tune, case: Case):
    """``tune`` on inputs of this shape (the winner is also stored for the shape's bucket)."""
    from tilews.lowering.settings import Settings
    if not case.machine.gpu and not Settings.from_env().tune:
        raise Unavailable("tuning runs on a GPU only: under the CPU interpreter it is slow "
                          "(TILEWS_TUNE=1 tunes here anyway)")
    a, b = make_inputs(case, torch.Generator(device=case.machine.device).manual_seed(1))
    return tune(a, b, case.dtype)


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
MLX = Reference("mlx.core.matmul", apple_gpu.mlx_matmul,
                runs_on=lambda m: "mlx Metal", interpreted=lambda m: False,
                unavailable=mlx_unavailable, targets=("metal",))
MPS = Reference("torch.mm (MPS)", apple_gpu.mps_mm,
                runs_on=lambda m: "torch MPS", interpreted=lambda m: False,
                unavailable=mps_unavailable, targets=("metal",))

WORKLOAD = Workload(
    name="gemm", dims="MNK", presets=PRESETS, default_preset=standard_preset,
    flops=flops,
    make_inputs=make_inputs, make_output=make_output, reference=_reference,
    tolerance=1e-2,
    # 128 threads: one consumer warp group; on a GPU also 128x256 tiles over 256 threads, two
    # consumer warp groups (on Hopper, plus the producer warp group warp specialization adds)
    variants=[tilews_variant(128, 128, 64, 3)]
    + ([tilews_variant(128, 256, 64, 3, threads=256, swizzle=16),
        persistent_variant(128, 256, 64, 3, threads=256)] if torch.cuda.is_available() else [])
    + [tilews_variant(64, 64, 32, 2, unavailable=_metal_only)]     # 4 simdgroups, 16 KB of tiles
    + [explicit_variant("ws_matmul_program", "one handshake 128x128x32"),
       explicit_variant("ws_ring_matmul_program", "ring 128x256x64 s3"),
       explicit_variant("pingpong_matmul_program", "ping-pong 128x128x64 s4")]
    + [ops_variant(tuned=False), ops_variant(tuned=True)],
    references=[TORCH, TRITON, MLX, MPS])
