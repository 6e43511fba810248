"""The FP8 workload: C = (A * scale_a) @ (B * scale_b), float8_e4m3fn A [M, K] and B [K, N], float32
scales, fp32 accumulation, a bf16 result (fp16 with ``--dtype fp16``: here the dtype names the
output). B is column-major, as torch passes a weight (``b = w.t()``, w [N, K] contiguous).

A shape's mode names the scales' granularity and the accumulation (``4096x4096x4096:row``):
``tensor`` (one scale per operand, [1]), ``row`` (scale_a [M, 1], scale_b [1, N]) and ``block``
(scale_a [M, ceil(K/128)], one per 1x128 block of A; scale_b [ceil(K/128), ceil(N/128)], one per
128x128 block of B) promote the tensor cores' partial sums into fp32 every 128 of K, like cuBLAS's
default; ``tensor-fast`` and ``row-fast`` accumulate over all of K in the tensor-core accumulator
(``use_fast_accum=True``; block scales change every 128 of K, so block rows always promote). A
shape without a mode runs all five. FLOPs: 2 * M * N * K.

Operands are random normal values scaled into e4m3's range and scales random and positive (never
zero). The exact reference is float64 (A * scale_a) @ (B * scale_b), block scales expanded to the
elements they scale.

tilews variant: ``tilews.ops.fp8_scaled_mm``'s kernel (``tilews.ops.fp8.scaled_mm_kernel``)
rebuilt for each target, given what the op gives it and writing into the bench's C. References,
each on the rows it applies to:

* ``torch._scaled_mm`` with the row's scales and accumulation (tensor and row rows);
* on block rows, ``torch._scaled_mm rowwise`` (non-fast), the FP8 issue's yardstick for block-wise
  scaling (>= 0.9x of it), and torch's own block-wise ``torch.nn.functional.scaled_mm``
  (``BlockWise1x128`` x ``BlockWise128x128``: cuBLAS >= 12.9 on sm_90). A call torch refuses (a
  shape cuBLAS does not take, a CPU) makes that row unavailable with torch's reason, not a failure.

The rowwise baseline of a block row is checked like every row, so it multiplies the same exact
product: the block scales are per-row (A) and per-128-column (B) scales times powers of two
(2^-1, 1 or 2, random per block), and the baseline gets the operands times those powers, which
FP8 holds exactly (operands lie in [2^-4, 224] in magnitude, or are 0), with the per-row and
per-column scales: the last four inputs of a block row.

Block scales come in the layouts cuBLAS takes: scale_a outer-dim-major (stride (1, M)), scale_b
the transpose of a contiguous [ceil(N/128), ceil(K/128)]; cuBLAS wants the latter's K blocks
padded to a multiple of 4, which torch's block-wise reference does per call when K needs it (no
preset shape does).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from tilews.lowering.fp8 import SCALE_BLOCK, scale_blocks
from tilews.ops.fp8 import expand_scale, scaled_product

from . import gemm
from .kernels import for_target
from .machine import Machine
from .shapes import Shape, with_modes
from .workload import Case, Reference, Unavailable, Variant, Workload, standard_preset

E4M3 = torch.float8_e4m3fn
SPREAD = 64.0                # operands: random normal times this, scales about its inverse
SMALLEST = 2.0 ** -4         # smaller operands become 0: half of them is still a normal FP8 value
CUBLAS_SCALE_K_MULTIPLE = 4  # cuBLAS's 128x128 scales: K blocks padded to a multiple of this
TORCH_REFUSES = (RuntimeError, ValueError, NotImplementedError)   # how torch says "not this case"

MODES = ("tensor", "tensor-fast", "row", "row-fast", "block")
SQUARE = ((4096, 4096, 4096), (8192, 8192, 8192))
LLM = tuple((M, N, K) for M in (128, 1024, 8192) for N, K in ((4096, 4096), (14336, 4096), (4096, 14336)))
# a few tokens to a batch of them per step of decoding, at an LLM's projections
DECODE = tuple((M, N, K) for M in (16, 32, 64, 128) for N, K in ((4096, 4096), (14336, 4096), (4096, 14336)))
PRESETS = {
    "square": with_modes(SQUARE, MODES),
    "small-k": with_modes(gemm.SMALL_K, ("row", "block")),
    "llm": with_modes(LLM, ("row", "block")),
    "bench": (with_modes(SQUARE, ("tensor", "row", "block")) + with_modes(gemm.SMALL_K, ("row", "block"))
              + with_modes(LLM, ("row", "block"))),          # the GPU default
    "gpu-quick": with_modes(SQUARE, ("row", "row-fast", "tensor", "block")) + ((128, 4096, 4096, "row"),),
    "decode": with_modes(DECODE, ("row", "tensor", "block")),
    "cpu": with_modes(((100, 72, 200), (64, 136, 300)), MODES),   # interpreter sizes, ragged
}


def _granularity(shape: Shape) -> str:
    return shape[3].partition("-")[0]


def _fast(shape: Shape) -> bool:
    return shape[3].endswith("-fast")


def _is_block(shape: Shape) -> bool:
    return _granularity(shape) == "block"


# ---- inputs and the exact reference (tests/gpu/test_fp8_gpu.py uses them too) ------------------

def fp8_operand(rows: int, cols: int, dtype: torch.dtype, gen: torch.Generator,
                device: torch.device) -> torch.Tensor:
    """[rows, cols] random normal times SPREAD, at most half of ``dtype``'s largest value in
    magnitude and at least SMALLEST (else 0), so twice or half of it is exact in ``dtype`` too."""
    half = torch.finfo(dtype).max / 2
    x = (torch.randn(rows, cols, generator=gen, device=device) * SPREAD).clamp(-half, half)
    return torch.where(x.abs() < SMALLEST, 0.0, x).to(dtype)


def positive_scale(shape: Sequence[int], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """float32 scales in [0.5, 1.5) / SPREAD: random, positive, never zero."""
    return (0.5 + torch.rand(tuple(shape), generator=gen, device=device)) / SPREAD


def scale_shapes(granularity: str, M: int, N: int, K: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of (scale_a, scale_b) for ``granularity`` (tensor, row or block), as
    ``torch._scaled_mm`` takes them."""
    if granularity == "tensor":
        return (1,), (1,)
    if granularity == "row":
        return (M, 1), (1, N)
    return (M, scale_blocks(K)), (scale_blocks(K), scale_blocks(N))


def scales(granularity: str, M: int, N: int, K: int, gen: torch.Generator,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b), random positive, of ``scale_shapes``; block scales in cuBLAS's layouts,
    transposes of contiguous tensors (module docstring)."""
    shapes = scale_shapes(granularity, M, N, K)
    if granularity != "block":
        return tuple(positive_scale(shape, gen, device) for shape in shapes)
    return tuple(positive_scale(shape[::-1], gen, device).t() for shape in shapes)


def exact(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """float64 (a * scale_a) @ (b * scale_b) (``tilews.ops.fp8.scaled_product``)."""
    return scaled_product(a, b, scale_a, scale_b, torch.float64)


def _powers_of_two(shape: Sequence[int], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """2^-1, 1 or 2 at random."""
    return 2.0 ** torch.randint(-1, 2, tuple(shape), generator=gen, device=device).float()


def _block_inputs(M: int, N: int, K: int, gen: torch.Generator, device: torch.device) -> tuple:
    """A block row's inputs: (a, b, scale_a, scale_b) and the rowwise baseline's (a, b, scale_a,
    scale_b) of the same exact product (module docstring)."""
    kb, nb = scale_blocks(K), scale_blocks(N)
    a, w = fp8_operand(M, K, E4M3, gen, device), fp8_operand(N, K, E4M3, gen, device)
    row, column_block = positive_scale((M, 1), gen, device), positive_scale((nb, 1), gen, device)
    pow_a, pow_w = _powers_of_two((M, kb), gen, device), _powers_of_two((nb, kb), gen, device)
    scale_a = (row * pow_a).t().contiguous().t()
    scale_b = (column_block * pow_w).t()
    a_rowwise = (a.double() * expand_scale(pow_a.double(), a.shape)).to(E4M3)
    w_rowwise = (w.double() * expand_scale(pow_w.double(), w.shape)).to(E4M3)
    column = column_block.repeat_interleave(SCALE_BLOCK)[:N].reshape(1, N)
    return a, w.t(), scale_a, scale_b, a_rowwise, w_rowwise.t(), row, column


def _make_inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    M, N, K, _ = case.shape
    dev = case.machine.device
    granularity = _granularity(case.shape)
    if granularity == "block":
        return _block_inputs(M, N, K, gen, dev)
    a, w = fp8_operand(M, K, E4M3, gen, dev), fp8_operand(N, K, E4M3, gen, dev)
    return (a, w.t(), *scales(granularity, M, N, K, gen, dev))


def _reference(case: Case, a, b, scale_a, scale_b, *rowwise) -> torch.Tensor:
    return exact(a, b, scale_a, scale_b)


def _rowwise_operands(inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    """What a tensorwise or rowwise ``torch._scaled_mm`` multiplies, of a row's inputs (``out``
    last): the four before ``out``, the case's own or, on a block row, the rowwise baseline's."""
    return inputs[-5:-1]


# ---- tilews variant ----------------------------------------------------------------------------

def _scale_like(shape: Sequence[int], granularity: str) -> torch.Tensor:
    """A meta tensor with the shape and the layout ``scales`` gives a scale (block scales: the
    transpose of a contiguous tensor), for the kernel ``kernel_mapping`` picks."""
    if granularity == "block":
        return torch.empty(tuple(shape)[::-1], dtype=torch.float32, device="meta").t()
    return torch.empty(tuple(shape), dtype=torch.float32, device="meta")


def _build_tilews(case: Case, target: str):
    """``tilews.ops.fp8_scaled_mm``'s kernel for ``target``, given what the op gives it
    (``kernel_mapping``, and on a GPU the op's untuned tiling, ``default_tiles``, with a split
    tiling's scratch operands) and writing into a caller-given C (no out_idx)."""
    from tilews.ops.fp8 import (default_tiles, kernel_mapping, scaled_mm_kernel, split_scratch,
                                tiled_kernel_mapping)
    M, N, K, _ = case.shape
    gran = _granularity(case.shape)
    like = [_scale_like(shape, gran) for shape in scale_shapes(gran, M, N, K)]
    a, w = (torch.empty(rows, K, dtype=E4M3, device="meta") for rows in (M, N))
    args, operands = kernel_mapping(a, w.t(), *like, out_dtype=case.dtype,
                                    use_fast_accum=_fast(case.shape))
    tiles = default_tiles(args, case.machine.device) if target == "hopper" else None
    args, operands = tiled_kernel_mapping(tiles, a, w.t(), *like, out_dtype=case.dtype,
                                          use_fast_accum=_fast(case.shape))
    kernel = for_target(scaled_mm_kernel.fn, target)(*args, tiles.hints() if tiles else ())
    scratch = split_scratch(tiles, M, N) or (lambda device: ())

    def run(a, b, scale_a, scale_b, *rest):
        kernel(*operands(a, b, scale_a, scale_b), *scratch(a.device), rest[-1])
    return run


# ---- references --------------------------------------------------------------------------------

def _probed(case: Case, call, what: str):
    """``call`` (inputs and ``out`` -> the result), after a first call on this case's inputs finds
    out whether torch takes the shape here: if not, ``Unavailable`` with torch's reason."""
    probe = _make_inputs(case, torch.Generator(device=case.machine.device).manual_seed(1))
    try:
        call(*probe, None)
    except TORCH_REFUSES as e:
        raise Unavailable(f"{what} does not take this case here: {' '.join(str(e).split())}") from e
    return call


def _build_scaled_mm(case: Case):
    """torch._scaled_mm on the row's tensorwise or rowwise operands, with its accumulation."""
    fast = _fast(case.shape)
    return _probed(case, lambda *inputs: torch._scaled_mm(
        *_rowwise_operands(inputs), out_dtype=case.dtype, use_fast_accum=fast, out=inputs[-1]),
        "torch._scaled_mm")


def _cublas_scale_b(scale_b: torch.Tensor) -> torch.Tensor:
    """scale_b [ceil(K/128), ceil(N/128)] with its K blocks padded to a multiple of 4 (cuBLAS)."""
    missing = -scale_b.shape[0] % CUBLAS_SCALE_K_MULTIPLE
    return F.pad(scale_b.t(), (0, missing), value=1.0).t() if missing else scale_b


def torch_blockwise(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    out_dtype: torch.dtype) -> torch.Tensor:
    """torch.nn.functional.scaled_mm with 1x128 blocks of A and 128x128 blocks of B, block scales
    of ``scales``'s shapes and layouts."""
    return F.scaled_mm(a, b, scale_a, F.ScalingType.BlockWise1x128, _cublas_scale_b(scale_b),
                       F.ScalingType.BlockWise128x128, output_dtype=out_dtype)


def _build_blockwise(case: Case):
    def call(a, b, scale_a, scale_b, *rest):
        return torch_blockwise(a, b, scale_a, scale_b, case.dtype)
    return _probed(case, call, "torch's block-wise scaled_mm")


def _blockwise_unavailable(machine: Machine):
    if not hasattr(getattr(F, "ScalingType", None), "BlockWise128x128"):
        return (f"torch {torch.__version__} has no block-wise torch.nn.functional.scaled_mm "
                f"(ScalingType.BlockWise1x128 / BlockWise128x128)")
    return None


def _on_cublas(machine: Machine) -> str:
    return "cuBLAS" if machine.gpu else "torch CPU"


SCALED_MM = Reference("torch._scaled_mm", _build_scaled_mm, runs_on=_on_cublas,
                      applies=lambda shape: not _is_block(shape))
ROWWISE = Reference("torch._scaled_mm rowwise", _build_scaled_mm, runs_on=_on_cublas, applies=_is_block)
BLOCKWISE = Reference("F.scaled_mm blockwise", _build_blockwise, runs_on=_on_cublas, applies=_is_block,
                      unavailable=_blockwise_unavailable)

WORKLOAD = Workload(
    name="fp8", dims="MNK", modes=MODES, presets=PRESETS, default_preset=standard_preset,
    flops=gemm.flops,
    make_inputs=_make_inputs, make_output=gemm.make_output, reference=_reference,
    tolerance=1e-2,
    variants=[Variant("tilews.ops.fp8_scaled_mm", _build_tilews)],
    references=[SCALED_MM, ROWWISE, BLOCKWISE])
