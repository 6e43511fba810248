"""FP8 scaled matrix multiply: ``T.fp8_scaled_matmul`` (docs/fp8.md).

Two forms, told apart by where the call is:

* **whole GEMM** (a ``T.prim_func`` body without ``T.Kernel``): A [M, K], B [K, N] (or [N, K]
  with ``transpose_B``), both FP8, in global memory; float32 scales whose shapes select the
  granularity (``tilews.lowering.fp8``); C [M, N] bf16, fp16 or fp32. The call expands into a tile
  program (``_scaled_gemm``) with tiles chosen for the target: per-tensor and per-row/column scales
  are applied once in the epilogue; block-wise scales promote each 128-wide k-block's product into
  the float32 accumulator. ``use_fast_accum=False`` (the default, as in ``torch._scaled_mm``)
  promotes per-tensor/row products every 128 of K too, which bounds the error of the tensor cores'
  limited-precision FP8 accumulation; ``True`` accumulates over all of K in one accumulator.
  ``bias`` [N] (bf16, fp16 or fp32) is added to the scaled float32 result in the epilogue, before
  C's one rounding.
* **tile operation** (inside ``T.Kernel``): ``C += (A @ op(B)) * a_scale[i] * b_scale[j]`` on
  shared (or fragment) FP8 tiles, a float32 accumulator fragment C, and scales that are vectors of
  the tile's rows / columns (fragments of [BM] / [BN]), one-element buffers, or scalar values. The
  product is formed in a fresh accumulator and promoted into C (the k-tile is at most 128 wide), so
  users can write their own fused FP8 kernels.

``determine_fp8_type`` is TileLang's helper naming the FP8 dtype of a format.
"""
from __future__ import annotations

from tilews.lowering import fp8 as scales
from tilews.lowering import ir
from tilews.lowering.errors import CompileTypeError, CompileValueError
from tilews.lowering.frontend import Macro, semantic
from tilews.lowering.frontend.context import builder, current_loc
from tilews.lowering.frontend.values import BufferRef, RegionRef, Scalar
from tilews.lowering.capabilities import SM90, bulk_copy_rows, wave_use
from tilews.targets import num_sms

from .copy import copy as tile_copy
from .elementwise import atomic_add, cast, ceildiv, clear
from .elementwise import min as min_
from .gemm import gemm
from .kernel import Kernel, use_swizzle
from .loops import Parallel, Pipelined, serial
from .memory import alloc_shared

_OUT_DTYPES = (ir.DType.BF16, ir.DType.F16, ir.DType.F32)
_BOX_MOST = 256             # elements along one dimension of a bulk copy's box
_ROW_LEAST = 32             # B scales in a shared row: 128 bytes, as bulk copies write
_HINTS = ("block_M", "block_N", "num_stages", "threads", "panel", "splits", "transpose_C")


def determine_fp8_type(fp8_format: str = "e4m3") -> ir.DType:
    """The dtype of an FP8 format: "e4m3" -> ``T.float8_e4m3fn``, "e5m2" -> ``T.float8_e5m2``
    (NVIDIA's formats; tilews has no ROCm "fnuz" variants)."""
    formats = {"e4m3": ir.DType.F8E4M3, "e5m2": ir.DType.F8E5M2}
    if fp8_format not in formats:
        raise ValueError(f"determine_fp8_type: unsupported FP8 format {fp8_format!r}; use 'e4m3' "
                         f"or 'e5m2'")
    return formats[fp8_format]


def determine_torch_fp8_type(fp8_format: str = "e4m3"):
    """``determine_fp8_type(fp8_format)`` as a torch dtype."""
    return determine_fp8_type(fp8_format).as_torch()


def _library_macro(fn):
    """A macro of this module: what it builds cites the user's call, where errors must point."""
    return Macro(fn, cite_caller=True)


def fp8_scaled_matmul(A, A_scale, B, B_scale, C, transpose_B: bool = False,
                      use_fast_accum: bool = False, transpose_A_scale: bool = False, bias=None,
                      workspace=None, arrivals=None, **hints) -> None:
    """See the module docstring. ``transpose_A_scale`` (whole GEMM, block-wise scales): A_scale
    is given as [ceil(K / 128), M], k-block-major, the layout ``torch._scaled_mm`` wants block-wise
    A scales in (its [M, K / 128] tensor with strides (1, M) is this tensor transposed); on
    Hopper each k-block's scales then travel with the A and B tiles, one bulk copy per stage.
    ``hints`` (``block_M``, ``block_N``, ``num_stages``, ``threads``, and ``panel``:
    ``T.use_swizzle``'s panel of tile rows, 0 for the target's default) override the whole-GEMM
    form's tile choice; they never change results. ``splits`` (whole GEMM, per-tensor / per-row
    scales): K cut into that many slices, one block per (tile, slice), summed in the same kernel
    (``_split_sum``); it needs ``workspace``, float32 [M, splits * N'] (N' = N in whole tiles of
    ``block_N``: ``split_workspace_shape``), and ``arrivals``, int32 counters, one per output tile,
    zero at launch and left zero (``gemm_programs.split_k_fused``'s contract). ``transpose_C``
    (whole GEMM, no bias; split or not): C is given as [N, M] and receives the product transposed,
    stored by element (``tilews.ops.fp8_scaled_mm`` computes a few-row product as C^T = B A^T
    this way, the rows on the tiles' narrow N side)."""
    if builder().kernel is None:
        _whole_gemm(A, A_scale, B, B_scale, C, bool(transpose_B), bool(use_fast_accum),
                    bool(transpose_A_scale), bias, hints, workspace, arrivals)
    else:
        if hints or transpose_A_scale or bias is not None or workspace is not None \
                or arrivals is not None:
            named = [*hints] + (["transpose_A_scale"] if transpose_A_scale else []) + \
                (["bias"] if bias is not None else []) + \
                (["workspace"] if workspace is not None else []) + \
                (["arrivals"] if arrivals is not None else [])
            raise CompileValueError(f"T.fp8_scaled_matmul: {', '.join(named)} only apply to the "
                                    f"whole-GEMM form (without T.Kernel)", current_loc())
        _scaled_accumulate(A, A_scale, B, B_scale, C, bool(transpose_B))


# ---- checks ----------------------------------------------------------------------------------

def _type_error(msg: str) -> CompileTypeError:
    return CompileTypeError(f"T.fp8_scaled_matmul: {msg}", current_loc())


def _value_error(msg: str) -> CompileValueError:
    return CompileValueError(f"T.fp8_scaled_matmul: {msg}", current_loc())


def _check_fp8(name: str, dtype: ir.DType) -> None:
    if not dtype.is_fp8:
        raise _type_error(f"{name} is {dtype.value}; A and B must be float8_e4m3fn or float8_e5m2")


def _global_shape(name: str, x, dtype_check) -> tuple:
    if not isinstance(x, BufferRef) or x.buffer.scope is not ir.Scope.GLOBAL:
        raise _type_error(f"{name} must be a tensor parameter in the whole-GEMM form (without "
                          f"T.Kernel), got {x!r}")
    dtype_check(name, x.dtype)
    shape = x.shape
    if not all(isinstance(d, int) for d in shape):
        raise _value_error(f"{name} has runtime dimensions {shape}; the whole-GEMM form needs "
                           f"shapes known at build time")
    return shape


def _check_scale(name: str, dtype: ir.DType) -> None:
    if dtype is not ir.DType.F32:
        raise _type_error(f"{name} is {dtype.value}; scales must be float32")


def _check_workspace(name: str, dtype: ir.DType) -> None:
    if dtype is not ir.DType.F32:
        raise _type_error(f"{name} is {dtype.value}; a split's workspace must be float32")


def _check_counter(name: str, dtype: ir.DType) -> None:
    if dtype is not ir.DType.I32:
        raise _type_error(f"{name} is {dtype.value}; it must be int32")


def _check_bias(name: str, dtype: ir.DType) -> None:
    if dtype not in _OUT_DTYPES:
        raise _type_error(f"{name} is {dtype.value}; a bias must be bfloat16, float16 or float32")


def _check_out(name: str, dtype: ir.DType) -> None:
    if dtype not in _OUT_DTYPES:
        raise _type_error(f"{name} is {dtype.value}; the result must be bfloat16, float16 or "
                          f"float32")


# ---- the whole GEMM --------------------------------------------------------------------------

def _whole_gemm(A, A_scale, B, B_scale, C, transpose_B: bool, fast: bool, transpose_A_scale: bool,
                bias, hints: dict, workspace, arrivals) -> None:
    a_shape = _global_shape("A", A, _check_fp8)
    b_shape = _global_shape("B", B, _check_fp8)
    c_shape = _global_shape("C", C, _check_out)
    sa_shape = _global_shape("A_scale", A_scale, _check_scale)
    sb_shape = _global_shape("B_scale", B_scale, _check_scale)
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise _value_error(f"A {list(a_shape)} and B {list(b_shape)} must be matrices")
    M, K = a_shape
    N, KB = b_shape if transpose_B else b_shape[::-1]
    if KB != K:
        raise _value_error(f"A is [{M}, {K}] but B is {list(b_shape)}: K differs"
                           f"{'' if transpose_B else ' (B is [K, N]; transpose_B=True takes [N, K])'}")
    transpose_C = hints.get("transpose_C", False)
    if not isinstance(transpose_C, bool):
        raise _type_error(f"transpose_C must be a bool, got {transpose_C!r}")
    if tuple(c_shape) != ((N, M) if transpose_C else (M, N)):
        raise _value_error(f"C is {list(c_shape)}, not " +
                           (f"[N, M] = [{N}, {M}] (transpose_C=True)" if transpose_C
                            else f"[M, N] = [{M}, {N}]"))
    if transpose_C and bias is not None:
        raise _value_error("transpose_C=True takes no bias")
    if bias is not None and tuple(_global_shape("bias", bias, _check_bias)) != (N,):
        raise _value_error(f"bias is {list(bias.shape)}, not [N] = [{N}]")
    if transpose_A_scale:
        kb = scales.scale_blocks(K)
        if tuple(sa_shape) != (kb, M) or tuple(sb_shape) != (scales.scale_blocks(N), kb):
            raise _value_error(f"transpose_A_scale=True takes block-wise scales: A_scale "
                               f"[{kb}, {M}] ([ceil(K / 128), M]) and B_scale "
                               f"[{scales.scale_blocks(N)}, {kb}]; got A_scale {list(sa_shape)} "
                               f"and B_scale {list(sb_shape)}")
    try:
        # transposed scales are block-wise whatever their shapes also fit (K <= 128 and N == 1
        # read as per row: A_scale [1, M] would be indexed as [M, 1])
        gran = scales.Granularity(scales.Scaling.BLOCK, scales.Scaling.BLOCK) if transpose_A_scale \
            else scales.granularity(M, N, K, sa_shape, sb_shape)
    except ValueError as e:
        raise _value_error(str(e)) from None
    unknown = set(hints) - set(_HINTS)
    if unknown:
        raise _value_error(f"unknown tile hint(s) {', '.join(sorted(unknown))}; known: "
                           f"{', '.join(_HINTS)}")
    promote = gran.block_wise or not fast
    tiles = {**_tiles(builder().target, C.dtype, promote, transpose_B, M, N), "panel": 0,
             "splits": 1, "transpose_C": False, **hints}
    split = _split_buffers(gran, M, N, tiles, workspace, arrivals)
    _scaled_gemm(A, A_scale, B, B_scale, C, bias, gran, transpose_B, transpose_A_scale, promote,
                 M, N, K, split, **tiles)


def split_workspace_shape(M: int, N: int, block_N: int, splits: int) -> tuple[int, int]:
    """The float32 workspace of a whole GEMM split in ``splits`` K slices: [M, splits * N'],
    N' = N rounded up to whole ``block_N`` tiles (a ragged last tile's partial stays in its
    slice)."""
    return M, splits * -(-N // block_N) * block_N


def _split_buffers(gran, M: int, N: int, tiles: dict, workspace, arrivals):
    """(workspace, arrivals) of a split whole GEMM, checked; None unsplit."""
    splits = tiles["splits"]
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise _value_error(f"splits must be an int >= 1, got {splits!r}")
    if splits == 1:
        if workspace is not None or arrivals is not None:
            raise _value_error("workspace and arrivals are for a split K (splits > 1)")
        return None
    if gran.block_wise:
        raise _value_error("splits > 1 takes per-tensor or per-row/column scales: block-wise "
                           "scales promote each k-block scaled, in the k-loop")
    if workspace is None or arrivals is None:
        raise _value_error(f"splits={splits} needs workspace= (float32 "
                           f"{list(split_workspace_shape(M, N, tiles['block_N'], splits))}) and "
                           f"arrivals= (int32 counters, one per output tile)")
    want = split_workspace_shape(M, N, tiles["block_N"], splits)
    w_shape = _global_shape("workspace", workspace, _check_workspace)
    if tuple(w_shape) != want:
        raise _value_error(f"workspace is {list(w_shape)}; splits={splits} with block_N="
                           f"{tiles['block_N']} takes {list(want)}")
    if not isinstance(arrivals, BufferRef) or arrivals.buffer.scope is not ir.Scope.GLOBAL \
            or len(arrivals.shape) != 1:
        raise _type_error(f"arrivals must be a 1-d tensor parameter, got {arrivals!r}")
    _check_counter("arrivals", arrivals.dtype)
    return workspace, arrivals


# Hopper's tiles for the whole GEMM, largest first: (block_M, block_N, num_stages, threads). The
# deepest ring that fits: below one tile per SM the product is bound by moving operands.
# H100, against rowwise ``_scaled_mm`` (scripts/tune_fp8.py --tiles), block-wise / rowwise:
# 128 x 4096 x 4096 64x64 1.08 / 0.99x; 128 x 4096 x 14336 64x64 1.15 / 1.14x; 128 x 14336 x
# 4096 128x128 0.97 / 0.98x (128x256 tiles, called through the op, host time included: 0.44-0.89x
# at these three); 1024 x 14336 x 4096 (448 tiles of 128x256 on 132 SMs: 85% of the SM slots of
# its waves busy) 128x128 0.98x where 128x256 reached 0.94x.
_HOPPER_TILES = ((128, 256, 3, 256), (128, 128, 5, 256), (64, 128, 8, 128), (64, 64, 12, 128))
_FILL = 0.75                # a tiling fills the GPU with at least this many tiles per SM
_WAVE_USE = 0.9             # below this share of SM slots busy, 128x256 tiles give way to 128x128
_SMEM_BYTES = SM90.smem_bytes - 4 * 1024   # less room for scale vectors and barriers


def _tiles(target: str, out: ir.DType, promote: bool, transpose_B: bool, M: int, N: int) -> dict:
    """Tile sizes per target and shape. Hopper: 128 x 256 tiles (k-tiles of 128, one scale
    block; two consumer warp groups) where there is at least one per SM, the 16-bit result's
    staging tile fits and either one accumulator holds the tile or B is K-major (a promoting
    tile is then two accumulators of 128 columns: ``_part_width``), unless the last wave of
    them leaves more SMs idle than 128 x 128 tiles would; below one per SM the largest of
    ``_HOPPER_TILES`` whose count fills the SMs, else the smallest; for M <= 64 the 64-row
    ones only (``tune_fp8`` on an H100: 64 x 128 beat 128 x 128 at 16 and 64 x 14336 x 4096);
    stages cut to fit shared memory. Metal: 32 x 32 tiles, so the decoded float16 operand tiles
    (32 x 128 each) and the float32 accumulator stay inside its 32 KB of threadgroup memory."""
    if target != "hopper":
        return _default_tiles(target)
    sms = num_sms()
    shapes = _hopper_shapes(out, promote, transpose_B)
    wide = shapes[0] == _HOPPER_TILES[0]
    if M <= 64:             # a 128-row tile would be half empty
        shapes = [t for t in shapes if t[0] == 64]
    count = [ceildiv(M, bm) * ceildiv(N, bn) for bm, bn, _, _ in shapes]
    if count[0] >= sms:
        pick = shapes[0]
        if wide and wave_use(count[0], sms) < min(_WAVE_USE, wave_use(count[1], sms)):
            pick = shapes[1]
    else:
        pick = next((t for t, n in zip(shapes, count) if n >= _FILL * sms), shapes[-1])
    return _fitted(pick, out)


def _default_tiles(target: str) -> dict:
    """The tiles of a target other than Hopper, whatever the shape."""
    if target == "metal":
        return dict(block_M=32, block_N=32, num_stages=1, threads=128)
    return dict(block_M=64, block_N=64, num_stages=2, threads=128)


def _hopper_shapes(out: ir.DType, promote: bool, transpose_B: bool) -> tuple:
    """``_HOPPER_TILES`` this result and B allow: 128 x 256 only where the 16-bit result's
    staging tile fits and one accumulator holds the tile or B is K-major."""
    wide = out is not ir.DType.F32 and (transpose_B or not promote)
    return _HOPPER_TILES if wide else _HOPPER_TILES[1:]


def _fitted(tile: tuple, out: ir.DType) -> dict:
    """Hopper tile hints of (block_M, block_N, num_stages, threads), the stages cut so the ring
    and the result's staging tile fit shared memory."""
    bm, bn, stages, threads = tile
    room = (_SMEM_BYTES - bm * bn * out.itemsize) // ((bm + bn) * scales.SCALE_BLOCK + 4 * bm)
    return dict(block_M=bm, block_N=bn, num_stages=max(1, min(stages, room)), threads=threads)


def tile_candidates(target: str, out: ir.DType, promote: bool, transpose_B: bool) -> list[dict]:
    """The whole GEMM's tile hints worth timing on ``target`` (``tilews.ops.tune_fp8``): on
    Hopper each of ``_HOPPER_TILES`` that ``_tiles`` may pick for this result and B (stages
    fitted); elsewhere the target's default tiles and tiles of half their width."""
    if target == "hopper":
        return [_fitted(t, out) for t in _hopper_shapes(out, promote, transpose_B)]
    first = _default_tiles(target)
    return [first, {**first, "block_N": first["block_N"] // 2}]


def _a_scale(gran: scales.Granularity, SA, row):
    if gran.a is scales.Scaling.TENSOR:
        return SA[(0,) * len(SA.shape)]
    return SA[(row,) + (0,) * (len(SA.shape) - 1)]


def _b_scale(gran: scales.Granularity, SB, col):
    if gran.b is scales.Scaling.TENSOR:
        return SB[(0,) * len(SB.shape)]
    return SB[(0,) * (len(SB.shape) - 1) + (col,)]


def _wgmma_path(transpose_B: bool, N: int, K: int, out: ir.DType) -> bool:
    """Whether Hopper's wgmma path takes the program: B K-major and every row a whole number of
    16-byte units (A and B: K bytes; C: N elements), as TMA needs; the ``triton.language``
    fallback reads shared tiles whole."""
    return builder().target == "hopper" and transpose_B and bulk_copy_rows(K) \
        and bulk_copy_rows(N * out.itemsize)


def _part_width(block_N: int, promote: bool, wgmma_path: bool) -> int:
    """Columns per accumulator. On Hopper's wgmma path a promoting tile wider than 128 columns is
    held as accumulators of 128 columns that take turns with one product fragment: three
    fragments of 128 columns fit in a warp group's registers where two of 256 would not, and the
    wider tile reads fewer bytes per FLOP (scripts/probe_fp8_gluon.py: 1.00-1.06x ``_scaled_mm``
    rowwise where 128-column tiles reach 0.93-0.98x)."""
    part = scales.SCALE_BLOCK
    if wgmma_path and promote and block_N > part and block_N % part == 0:
        return part
    return block_N


@_library_macro
def _scaled_gemm(A, SA, B, SB, C, Bias, gran, transpose_B, sa_t, promote, M, N, K, split, block_M,
                 block_N, num_stages, threads, panel, splits, transpose_C):
    wgmma_path = _wgmma_path(transpose_B, N, K, C.dtype)
    part_N = _part_width(block_N, promote, wgmma_path)
    parts = _indices(block_N // part_N)
    tile = (A, SA, B, SB, C, Bias, gran, transpose_B, sa_t, promote, M, N, K, split, block_M,
            block_N, num_stages, panel, splits, transpose_C, wgmma_path, part_N, parts)
    if split:
        with Kernel(ceildiv(N, block_N), ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
            _gemm_tile(*tile, bx, by, bz)
    else:
        with Kernel(ceildiv(N, block_N), ceildiv(M, block_M), threads=threads) as (bx, by):
            _gemm_tile(*tile, bx, by, None)


@_library_macro
def _gemm_tile(A, SA, B, SB, C, Bias, gran, transpose_B, sa_t, promote, M, N, K, split, block_M,
               block_N, num_stages, panel, splits, transpose_C, wgmma_path, part_N, parts, bx, by,
               bz):
    """One output tile of ``_scaled_gemm`` (of K slice ``bz`` when ``split``; stored transposed
    into C [N, M] with ``transpose_C``)."""
    block_K = scales.SCALE_BLOCK
    per = ceildiv(scales.scale_blocks(K), splits)      # k-blocks of one K slice
    if panel:
        use_swizzle(panel)
    A_s = alloc_shared((block_M, block_K), A.dtype)
    B_s = alloc_shared((block_N, block_K) if transpose_B else (block_K, block_N), B.dtype)
    accs = []
    for _ in parts:
        accs.append(_accumulator(block_M, part_N))
    if gran.block_wise:
        ring = wgmma_path and sa_t and bulk_copy_rows(M * SA.dtype.itemsize)
        tile_scales = _BlockScales(SA, SB, sa_t, by * block_M, bx * block_N, block_M, part_N,
                                   len(parts), K, ring=ring, b_row=ring and _bulk_row(SB, K))
    if promote:
        partial = _partial(block_M, part_N)
    for acc in accs:
        clear(acc)
    if not gran.block_wise:
        outer_scales = _OuterScales(gran, SA, SB, by * block_M, bx * block_N, block_M,
                                    block_N, ahead=not promote)
    for k in Pipelined(per, num_stages=num_stages):
        kk = bz * per + k if split else k
        tile_copy(A[by * block_M, kk * block_K], A_s)
        if transpose_B:
            tile_copy(B[bx * block_N, kk * block_K], B_s)
        else:
            tile_copy(B[kk * block_K, bx * block_N], B_s)
        if gran.block_wise:
            tile_scales.load(k)
            tile_scales.advance(k)
        if promote:
            for q in parts:
                row_scale = col_scale = None    # per-tensor/row scales: in the epilogue
                if gran.block_wise:
                    row_scale = tile_scales.rows(q)
                    col_scale = tile_scales.columns(q, k)
                _product(A_s, _columns(B_s, q * part_N, part_N, transpose_B), transpose_B,
                         partial)
                _promote(accs[q], partial, row_scale, col_scale, block_M, part_N)
        else:
            gemm(A_s, B_s, accs[0], transpose_B=transpose_B)
    if split:
        width = split[0].shape[1] // splits
        tile = by * ceildiv(N, block_N) + bx
        _store_parts(accs, split[0], by * block_M, bz * width + bx * block_N)
        arrived = atomic_add(split[1][tile], 1, memory_order="acq_rel", return_prev=True)
        if arrived == splits - 1:
            _sum_slices(accs, split[0], by * block_M, bx * block_N, width, splits)
            outer_scales.apply(accs, _column_reader(Bias, bx * block_N))
            _store_result(accs, C, by * block_M, bx * block_N, M, N, transpose_C)
            atomic_add(split[1][tile], -splits)
    else:
        if not gran.block_wise:
            outer_scales.apply(accs, _column_reader(Bias, bx * block_N))
        else:
            _add_bias(accs, _column_reader(Bias, bx * block_N))
        _store_result(accs, C, by * block_M, bx * block_N, M, N, transpose_C)


def _store_result(accs: list, C, row0, col0, M: int, N: int, transpose_C: bool) -> None:
    """The finished tile stored at (row0, col0) of C [M, N], or of C^T with ``transpose_C``."""
    if transpose_C:
        _store_transposed(accs, C, row0, col0, M, N)
    else:
        _store_parts(accs, C, row0, col0)


def _store_parts(accs: list, dst, row0, col0) -> None:
    """A tile held as ``accs`` (parts of equal width, left to right) stored at (row0, col0) of
    ``dst``."""
    width = accs[0].shape[1]
    for p in _indices(len(accs)):
        tile_copy(accs[p], dst[row0, col0 + p * width])


@_library_macro
def _store_transposed(accs, C, row0, col0, M, N):
    """The tile held as ``accs`` stored transposed: its element (i, j) at C[col0 + j, row0 + i]
    of C [N, M], elements past M or N left out. The swapped product of a few rows (``fp8_scaled_mm``
    at M <= 128, ``swap_tiles``, computes C^T = B A^T, so the tokens are the tile's narrow N side)
    writes its result where the caller wants it, without a transposing copy."""
    block_M, part_N = accs[0].shape
    for i, j in Parallel(block_M, part_N):
        for q in _indices(len(accs)):
            if row0 + i < M:
                if col0 + q * part_N + j < N:
                    C[col0 + q * part_N + j, row0 + i] = cast(accs[q][i, j], C.dtype)


@_library_macro
def _sum_slices(accs, W, row0, col0, width, splits):
    """``accs`` = the sum of the tile's ``splits`` partials in W (slice s at column s * width),
    in slice order: the same bits whichever block sums them. A split whole GEMM stores each
    K slice's unscaled partial tile there, counts it in the tile's arrival counter (acq_rel), and
    the block arriving last (every other partial visible to it) sums them, scales the sum once
    and stores C, as ``gemm_programs.split_k_fused`` does."""
    block_M, part_N = accs[0].shape
    for acc in accs:
        clear(acc)
    for s in serial(splits):
        for i, j in Parallel(block_M, part_N):
            for q in _indices(len(accs)):
                accs[q][i, j] += W[row0 + i, s * width + col0 + q * part_N + j]


def _column_reader(Bias, col0):
    """``j -> Bias[col0 + j]`` in float32; None without a bias."""
    if Bias is None:
        return None
    return lambda j: cast(Bias[col0 + j], ir.DType.F32)


def _add_bias(accs: list, bias) -> None:
    """``accs`` (a tile's parts, left to right) plus ``bias(column)``, when there is one."""
    if bias is not None:
        _scale_parts(accs, None, None, bias)


def _bulk_row(SB, K: int) -> bool:
    """Whether a row of B's block scales (B_scale [ceil(N / 128), ceil(K / 128)]) is one bulk
    copy: rows of whole 16-byte units, at most 256 k-blocks (a box's largest dimension)."""
    blocks = scales.scale_blocks(K)
    return bulk_copy_rows(blocks * SB.dtype.itemsize) and blocks <= _BOX_MOST


class _OuterScales:
    """A tile's per-tensor / per-row / per-column scales, applied to its accumulators after the
    k-loop, ``C = (C * A_scale[row]) * B_scale[column]``, loaded where their L2 round trips hide.
    With one accumulator (fast accumulation) they are loaded into fragments (A's per row, B's per
    column) before the k-loop, so the epilogue waits on no load. A promoting tile's registers hold
    its parts and the product fragment, and a per-column fragment would keep ``split_consumers``
    from giving each warp group its own rows: its parts are scaled in one loop instead, so every
    part's loads are in flight together (one round trip per tile, not one per part). H100, 11
    interleaved rounds, against the per-part loads: fast 8192^3 1.013x, 4096^3 1.026x; rowwise
    promoted 1.019x, 1.015x."""

    def __init__(self, gran, SA, SB, row0, col0, block_M: int, block_N: int, ahead: bool):
        self.row_scale = lambda i: _a_scale(gran, SA, row0 + i)
        self.column_scale = lambda j: _b_scale(gran, SB, col0 + j)
        self.rows = self.columns = None
        if ahead:
            self.rows = semantic.alloc((block_M,), ir.DType.F32, ir.Scope.FRAGMENT, "sa")
            _fill(self.rows, self.row_scale, block_M)
            self.columns = semantic.alloc((block_N,), ir.DType.F32, ir.Scope.FRAGMENT, "sb")
            _fill(self.columns, self.column_scale, block_N)

    def apply(self, accs: list, bias=None) -> None:
        """Scale the tile, held as ``accs``: parts of equal width, left to right; then add
        ``bias(column)`` when given."""
        if self.rows is not None:
            _scale_parts(accs, lambda i: self.rows[i], lambda j: self.columns[j], bias)
        else:
            _scale_parts(accs, self.row_scale, self.column_scale, bias)


@_library_macro
def _fill(frag, value, n):
    for i in Parallel(n):
        frag[i] = value(i)


@_library_macro
def _scale_parts(accs, row_scale, column_scale, bias):
    block_M, part_N = accs[0].shape
    for i, j in Parallel(block_M, part_N):
        for q in _indices(len(accs)):
            accs[q][i, j] = _epilogue(accs[q][i, j], row_scale, column_scale, bias, i,
                                      q * part_N + j)


def _epilogue(x, row_scale, column_scale, bias, i, j):
    """``x * row_scale(i) * column_scale(j) + bias(j)``, each part only when given."""
    if row_scale is not None:
        x = x * row_scale(i)
    if column_scale is not None:
        x = x * column_scale(j)
    return x if bias is None else x + bias(j)


def _accumulator(block_M: int, width: int) -> BufferRef:
    return semantic.alloc((block_M, width), ir.DType.F32, ir.Scope.FRAGMENT, "C_f")


def _indices(n: int) -> list:
    """0 .. n - 1 as build-time integers (a kernel's ``range`` is a loop)."""
    return list(range(n))


def _columns(B_s, start: int, width: int, transpose_B: bool):
    """Columns [start, start + width) of the B tile ([N, K] rows when transposed)."""
    if transpose_B:
        return B_s[start:start + width, :]
    return B_s[:, start:start + width]


class _BlockScales:
    """A tile's block-wise scales, loaded ahead of their k-block. Iteration k first forms its
    row scales from A's scales for k-block k and B's loaded during earlier iterations, then issues
    the loads for later k-blocks into the registers it has just consumed, so no load's L2 round
    trip is waited on within the iteration that issued it (measured on an H100: 0.80x rowwise
    ``_scaled_mm`` when each k-block loaded its own scales before its product).

    A's scales: with ``ring`` (Hopper's wgmma path, A_scale given k-block-major with rows of
    whole 16-byte units) each k-block's 128 row scales are one bulk copy into a shared buffer,
    which the pipeline gives the A and B tiles' ring slots and barriers, so the producer loads
    them and the consumers read them from shared memory (H100, 8192^3: consumers loading them
    from global memory, one row per sector, ran at 0.89-0.91x rowwise ``_scaled_mm``, and
    1.05-1.08x faster with those loads deleted; through the ring, 0.97x). Otherwise the consumers
    load them into registers one k-block ahead.

    B's scales: a part of the tile whose columns lie in one 128-column block gets B's scale
    spread over the tile's rows. With ``b_row`` (the A ring, and B_scale [ceil(N / 128),
    ceil(K / 128)] with rows of whole 16-byte units and at most 256 k-blocks) each such block's
    row of scales is one bulk copy into shared memory per tile, before its k-loop (a box
    starting at k-block 0: a bulk copy starting inside a row faulted on an H100), and each
    k-block reads its scale there (H100, 128 x 4096 x 4096, 64 x 128 tiles: 0.79x rowwise
    ``_scaled_mm`` with the consumers loading them, 1.10x with those loads deleted, as fast as
    rowwise scaling). Otherwise the consumers load them two k-blocks ahead and move them one
    step per iteration:
    ptxas keeps that uniform value in a uniform register and moves it there as early as it can,
    which, one k-block ahead, waited on the load between the wgmma issues of the next k-block.
    Wider parts read B's scale per column in their own k-block (``columns``)."""

    def __init__(self, SA, SB, sa_t: bool, row0, col0, block_M: int, part_N: int, parts: int,
                 K: int, ring: bool, b_row: bool):
        self.SA, self.SB, self.sa_t, self.row0 = SA, SB, sa_t, row0
        self.block_M, self.part_N = block_M, part_N
        self.cols = [col0 + q * part_N for q in _indices(parts)]
        self.last_k = scales.scale_blocks(K) - 1
        spread = parts if scales.SCALE_BLOCK % part_N == 0 else 0
        self.a = self._row_vector()
        self.a_ring = semantic.alloc((block_M,), ir.DType.F32, ir.Scope.SHARED, "A_scale_s") \
            if ring else None
        row = max(_ROW_LEAST, 1 << self.last_k.bit_length())   # k-blocks: a power of 2
        self.b_row = [semantic.alloc((row,), ir.DType.F32, ir.Scope.SHARED, "B_scale_s")
                      for _ in _indices(spread if b_row else 0)]
        for q, scales_of_q in enumerate(self.b_row):
            tile_copy(self.SB[self.cols[q] // scales.SCALE_BLOCK, 0], scales_of_q)
        ahead = 0 if self.b_row else spread
        self.b = [self._row_vector() for _ in _indices(ahead)]          # k-block k's
        self.b_ahead = [self._row_vector() for _ in _indices(ahead)]    # k + 1's
        self.row_scales = []
        if not ring:
            _fill(self.a, self._a_scale(0), block_M)
        self._fetch_b(self.b, 0)
        self._fetch_b(self.b_ahead, min(1, self.last_k))

    def _row_vector(self) -> BufferRef:
        return semantic.alloc((self.block_M,), ir.DType.F32, ir.Scope.FRAGMENT, "scale")

    def _a_scale(self, k):
        """A's scale of the tile's row i in k-block k, as a function of i."""
        if self.sa_t:
            return lambda i: self.SA[k, self.row0 + i]
        return lambda i: self.SA[self.row0 + i, k]

    def _fetch_b(self, frags: list, k) -> None:
        for q, frag in enumerate(frags):
            _fill(frag, lambda i, col=self.cols[q] // scales.SCALE_BLOCK: self.SB[col, k],
                  self.block_M)

    def load(self, k) -> None:
        """Iteration k's copies, beside the A and B tiles': A's scales into the ring."""
        if self.a_ring is not None:
            tile_copy(self.SA[k, self.row0], self.a_ring)

    def advance(self, k) -> None:
        """Iteration k: k-block k's row scales, then the loads ahead (clamped to the last
        k-block: in bounds, unread)."""
        if self.a_ring is not None:
            tile_copy(self.a_ring, self.a)
        self.row_scales = []
        for q in _indices(len(self.cols)):
            s = self._row_vector()
            if self.b_row:
                _fill(s, lambda i, row=self.b_row[q]: self.a[i] * row[k], self.block_M)
            elif self.b:
                _fill(s, lambda i, b=self.b[q]: self.a[i] * b[i], self.block_M)
            else:
                tile_copy(self.a, s)
            self.row_scales.append(s)
        for now, ahead in zip(self.b, self.b_ahead):
            tile_copy(ahead, now)
        if self.a_ring is None:
            _fill(self.a, self._a_scale(min_(k + 1, self.last_k)), self.block_M)
        self._fetch_b(self.b_ahead, min_(k + 2, self.last_k))

    def rows(self, q):
        """Part q's row scale (A's, times B's when spread) as a function of the row."""
        return _scale_vector("A_scale", self.row_scales[q], self.block_M)

    def columns(self, q, k):
        """Part q's column scale for k-block k as a function of the column, or None when B's
        scale is spread over the rows."""
        if self.b or self.b_row:
            return None
        sb = semantic.alloc((self.part_N,), ir.DType.F32, ir.Scope.FRAGMENT, "sb", hoist=True)
        _fill_columns(self.SB, sb, self.cols[q], k, self.part_N)
        return _scale_vector("B_scale", sb, self.part_N)


def _fill_columns(SB, sb, col0, k, width):
    _fill(sb, lambda j: SB[(col0 + j) // scales.SCALE_BLOCK, k], width)


# ---- the tile operation ----------------------------------------------------------------------

def _tile(name: str, x, scopes) -> ir.Region:
    r = semantic.as_region(x, f"T.fp8_scaled_matmul operand {name}")
    if r.buffer.scope not in scopes:
        raise _type_error(f"{name} ('{r.buffer.name}') is in {r.buffer.scope.value} memory; inside "
                          f"T.Kernel the operands are tiles ({' or '.join(s.value for s in scopes)}); "
                          f"the whole-GEMM form on global tensors is used without T.Kernel")
    return r


def _scale_vector(name: str, s, length: int):
    """``s`` as a function of a row (column) index: a [length] or one-element buffer, or a
    scalar value; Python 1.0 is None (no factor)."""
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return None if s == 1 else (lambda i: s)
    if isinstance(s, Scalar) and not isinstance(s, BufferRef):
        if not s.dtype.is_float:
            raise _type_error(f"{name} is {s.dtype.value}; scales must be float32")
        return lambda i: s
    if isinstance(s, (BufferRef, RegionRef)):
        r = semantic.as_region(s, f"T.fp8_scaled_matmul {name}")
        _check_scale(name, r.buffer.dtype)
        if r.buffer.scope is ir.Scope.GLOBAL:
            raise _type_error(f"{name} is a global tensor; inside T.Kernel scales are fragments "
                              f"(copy the tile's scales first) or values")
        shape = r.tile_shape
        if shape not in ((length,), (1,)):
            raise _value_error(f"{name} has shape {list(shape)}; it must be [{length}] (one per "
                               f"row/column of the tile) or [1]")
        ref = BufferRef(r.buffer)
        if shape == (1,):
            return lambda i: ref[r.starts[0]]
        return lambda i: ref[Scalar(r.starts[0]) + i]
    raise _type_error(f"{name} must be a scale fragment, a one-element buffer or a value, "
                      f"got {s!r}")


def _scaled_accumulate(A, A_scale, B, B_scale, C, transpose_B: bool) -> None:
    tile_scopes = (ir.Scope.SHARED, ir.Scope.FRAGMENT)
    ra, rb = _tile("A", A, tile_scopes), _tile("B", B, tile_scopes)
    rc = _tile("C", C, (ir.Scope.FRAGMENT,))
    if not rc.is_whole:
        raise _value_error(f"C must be a whole accumulator fragment, not a part of '{rc.buffer.name}'")
    _check_fp8("A", ra.buffer.dtype)
    _check_fp8("B", rb.buffer.dtype)
    if rc.buffer.dtype is not ir.DType.F32 or len(rc.tile_shape) != 2:
        raise _type_error(f"C ('{rc.buffer.name}') must be a 2-d float32 accumulator fragment")
    bm, bn = rc.tile_shape
    bk = ra.tile_shape[-1] if len(ra.tile_shape) == 2 else 0
    if bk > scales.SCALE_BLOCK:
        raise _value_error(f"A's k-tile is {bk} wide; the tile form promotes each product into C, "
                           f"at least every {scales.SCALE_BLOCK} elements of K: use k-tiles of at "
                           f"most {scales.SCALE_BLOCK}")
    sa = _scale_vector("A_scale", A_scale, bm)
    sb = _scale_vector("B_scale", B_scale, bn)
    partial = _partial(bm, bn)
    _product(RegionRef(ra), RegionRef(rb), transpose_B, partial)
    _promote(BufferRef(rc.buffer), partial, sa, sb, bm, bn)


def _partial(bm: int, bn: int) -> BufferRef:
    """A fresh float32 fragment for FP8 products, promoted into an accumulator after each
    (which the kernel then promises: ``fp8_promote_every``)."""
    builder().fp8_promote_every = scales.SCALE_BLOCK
    return semantic.alloc((bm, bn), ir.DType.F32, ir.Scope.FRAGMENT, "fp8_partial", hoist=True)


def _product(A, B, transpose_B: bool, partial: BufferRef) -> None:
    """partial = A @ op(B)."""
    semantic.gemm(A, B, partial, False, transpose_B, True)


@_library_macro
def _promote(C, partial, sa, sb, bm, bn):
    for i, j in Parallel(bm, bn):
        C[i, j] += _scaled(partial[i, j], sa, sb, i, j)


def _scaled(x, sa, sb, i, j):
    """x times its scales, the scales multiplied first (as ``_BlockScales`` folds B's block
    scale into the row scales, so the rounding does not depend on the tile width)."""
    if sa is not None and sb is not None:
        return x * (sa(i) * sb(j))
    if sa is not None:
        return x * sa(i)
    return x if sb is None else x * sb(j)
