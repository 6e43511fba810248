"""FP8 scaled matmul as a ready-made op: ``fp8_scaled_mm``, a drop-in for ``torch._scaled_mm``.

Built on the tile language's ``T.fp8_scaled_matmul`` (whole-GEMM form): on Hopper a
warp-specialized, persistent FP8 wgmma kernel when b is column-major (torch's convention: ``b =
w.t()`` with w [N, K] contiguous, i.e. K-major); a row-major b is read as it is, tile by tile
(``triton.language`` transposes tiles on Hopper). On CPU tensors it runs on the interpreter path.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import tilews
import tilews.language as T
from tilews import targets
from tilews.binding import remember
from tilews.jit import compile_each
from tilews.language.fp8 import split_workspace_shape, tile_candidates
from tilews.lowering import dtypes
from tilews.lowering.capabilities import bulk_copy_rows
from tilews.lowering.fp8 import SCALE_BLOCK, Scaling, granularity, scale_blocks
from tilews.lowering.settings import Settings

from .arrivals import arrival_counters
from .gemm_programs import ARRIVAL_SLOTS
from .schedule import bucket
from .winners import Winners, attempt, device_name, fastest

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)


@tilews.jit(out_idx=[-1])
def scaled_mm_kernel(M, N, K, a_scale_shape, b_scale_shape, transpose_B, use_fast_accum,
                     a_dtype=T.float8_e4m3, b_dtype=T.float8_e4m3, out_dtype=T.bfloat16,
                     transpose_A_scale=False, tiles=(), bias_dtype=None):
    """C = scaled (A @ B) for A [M, K] and B [N, K] (``transpose_B``) or [K, N]; the scale
    shapes choose the granularity (``tilews.lowering.fp8``); block-wise A scales
    k-block-major with ``transpose_A_scale``; ``tiles``: (name, value) pairs of the intrinsic's
    tile hints (none: the target's default tiles); with ``bias_dtype``, a ``bias`` [N] parameter
    before ``out``, added in the epilogue; with a ``splits`` hint above 1, ``arrivals`` (int32
    counters, ``split_counters``) and ``workspace`` (float32, ``split_workspace_shape``)
    parameters before ``out``; with a ``transpose_C`` hint, ``out`` is C transposed, [N, M]. The
    parameters are named as ``fp8_scaled_mm``'s."""
    a_t, b_t = T.Tensor((M, K), a_dtype), T.Tensor((N, K) if transpose_B else (K, N), b_dtype)
    sa_t, sb_t = T.Tensor(a_scale_shape, T.float32), T.Tensor(b_scale_shape, T.float32)
    c_t = T.Tensor((N, M) if dict(tiles).get("transpose_C") else (M, N), out_dtype)
    options = dict(transpose_B=transpose_B, use_fast_accum=use_fast_accum,
                   transpose_A_scale=transpose_A_scale, **dict(tiles))
    bias_t = T.Tensor((N,), bias_dtype or T.float32)
    splits = dict(tiles).get("splits", 1)
    if splits > 1:
        counters_t = T.Tensor((ARRIVAL_SLOTS,), T.int32)
        w_t = T.Tensor(split_workspace_shape(M, N, dict(tiles)["block_N"], splits), T.float32)
        if bias_dtype is None:
            @T.prim_func
            def main(a: a_t, scale_a: sa_t, b: b_t, scale_b: sb_t, arrivals: counters_t,
                     workspace: w_t, out: c_t):
                T.fp8_scaled_matmul(a, scale_a, b, scale_b, out, workspace=workspace,
                                    arrivals=arrivals, **options)
            return main

        @T.prim_func
        def main(a: a_t, scale_a: sa_t, b: b_t, scale_b: sb_t, bias: bias_t,  # noqa: F811
                 arrivals: counters_t, workspace: w_t, out: c_t):
            T.fp8_scaled_matmul(a, scale_a, b, scale_b, out, bias=bias, workspace=workspace,
                                arrivals=arrivals, **options)
        return main
    if bias_dtype is None:
        @T.prim_func
        def main(a: a_t, scale_a: sa_t, b: b_t, scale_b: sb_t, out: c_t):  # noqa: F811
            T.fp8_scaled_matmul(a, scale_a, b, scale_b, out, **options)
        return main

    @T.prim_func
    def main(a: a_t, scale_a: sa_t, b: b_t, scale_b: sb_t, bias: bias_t, out: c_t):  # noqa: F811
        T.fp8_scaled_matmul(a, scale_a, b, scale_b, out, bias=bias, **options)
    return main


# How an input of ``fp8_scaled_mm`` becomes an operand of its kernel: the source of the views or
# copies applied to it, in order (``Operands`` spells them into one function per kind of call:
# views cost ~0.5-0.7 us each, so a cached call makes only those it needs, no function per step)
_SAME: tuple[str, ...] = ()
_FLAT = ("[None]",)           # a 0-d per-tensor scale as the [1] the kernel takes (cheaper than reshape)
_TRANSPOSED = (".t()",)
_TRANSPOSED_COPY = (".t()", ".contiguous()")
_CONTIGUOUS = (".contiguous()",)


def _after_transpose(steps: tuple[str, ...]) -> tuple[str, ...]:
    """The steps of ``x.t()`` followed by ``steps``, from x (two transposes are x itself)."""
    return steps[1:] if steps[:1] == _TRANSPOSED else _TRANSPOSED + steps


@dataclass(frozen=True)
class Operands:
    """The operands ``scaled_mm_kernel`` takes before C, from ``fp8_scaled_mm``'s (a, b, sa, sb):
    per operand, in the kernel's order, the input it is made from (``sources``, one of those
    names) and the steps applied to it (source: ``.t()``, ``.contiguous()``, ``[None]``).
    Called, it maps the inputs; ``exprs`` spells each operand for a generated call."""
    sources: tuple[str, ...]
    steps: tuple[tuple[str, ...], ...]

    def exprs(self) -> list[str]:
        return [source + "".join(steps) for source, steps in zip(self.sources, self.steps)]

    def __call__(self, a, b, sa, sb) -> tuple:
        return self._function(a, b, sa, sb)

    @functools.cached_property
    def _function(self):
        return eval(f"lambda a, b, sa, sb: ({''.join(e + ', ' for e in self.exprs())})")  # noqa: S307

    def swapped(self) -> "Operands":
        """These operands, made for the swapped inputs (b.t(), a.t(), sb, sa), from the caller's:
        a transpose before each of the first two, the trading of names undone."""
        trade = {"a": "b", "b": "a", "sa": "sb", "sb": "sa"}
        return Operands(tuple(trade[s] for s in self.sources),
                        tuple(_after_transpose(st) if s in ("a", "b") else st
                              for s, st in zip(self.sources, self.steps)))


def _scales(M: int, N: int, K: int, scale_a: torch.Tensor, scale_b: torch.Tensor):
    """torch's scale conventions -> the intrinsic's: block-wise b scales are [K / 128, N / 128]
    in torch's orientation, [N / 128, K / 128] in the intrinsic's (a transposed view); block-wise
    a scales stored M-major, as torch's block-wise ``_scaled_mm`` takes them, go k-block-major
    (``transpose_A_scale``: [K / 128, M], a contiguous view), which lets the Hopper kernel
    bulk-copy each k-block's scales beside its tiles; row-major ones go as they are (copying
    them to the other layout cost more than it saved: H100, 4096^3 and 1024 x 14336 x 4096, 2.5%
    and 3.5% below the M-major call). With k-block-major a scales the b scales are bulk-copied
    too, as a contiguous [N / 128, K / 128] tensor: torch's layout for them (the transpose of
    one) is a view, any other a copy. Returns (the a scales' steps, the b scales' steps, whether
    the a scales are k-block-major): each takes a tensor of this shape and strides to the
    kernel's operand (``Operands``)."""
    kb, nb = scale_blocks(K), scale_blocks(N)
    to_a = _FLAT if scale_a.dim() == 0 else _SAME
    to_b = _FLAT if scale_b.dim() == 0 else _SAME
    sa, sb = tuple(scale_a.shape) or (1,), tuple(scale_b.shape) or (1,)
    if sa == (M, kb) and sb == (kb, nb) and sb != (1, N):
        if not scale_a.t().is_contiguous():
            return _SAME, _TRANSPOSED, False
        return _TRANSPOSED, _TRANSPOSED if scale_b.t().is_contiguous() else _TRANSPOSED_COPY, True
    try:            # per tensor / row / column; block-wise b scales only in torch's orientation
        if not granularity(M, N, K, sa, sb).block_wise:
            return to_a, to_b, False
    except ValueError:
        pass
    raise ValueError(f"fp8_scaled_mm(): scale_a {list(scale_a.shape)} and scale_b "
                     f"{list(scale_b.shape)} match no granularity for M={M}, N={N}, K={K}; "
                     f"accepted: per tensor [] or [1] each; per row / column scale_a [{M}, 1] and "
                     f"scale_b [1, {N}]; block-wise scale_a [{M}, {kb}] (1 x 128 blocks of a) and "
                     f"scale_b [{kb}, {nb}] (128 x 128 blocks of b)")


def kernel_mapping(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, use_fast_accum: bool = False):
    """``fp8_scaled_mm``'s inputs checked and mapped onto its kernel: (the arguments of
    ``scaled_mm_kernel``, the ``Operands`` (a, b, scale_a, scale_b) -> the operands its kernel
    takes before C, for inputs of these shapes, strides and dtypes). A column-major b is passed
    as the [N, K] tensor it is a view of (the K-major Hopper path); block-wise b scales as the
    intrinsic's [N / 128, K / 128] view. Reads only shapes, strides and dtypes (meta tensors
    do)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"fp8_scaled_mm(): '{name}' must be a 2-d tensor")
        if t.dtype not in _FP8:
            raise TypeError(f"fp8_scaled_mm(): '{name}' is {t.dtype}; a and b must be "
                            f"torch.float8_e4m3fn or torch.float8_e5m2")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"fp8_scaled_mm(): '{name}' must be a float32 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if out_dtype not in _OUT:
        raise TypeError(f"fp8_scaled_mm(): out_dtype must be torch.bfloat16, torch.float16 or "
                        f"torch.float32, got {out_dtype}")
    (M, K), (K2, N) = a.shape, b.shape
    if K2 != K:
        raise ValueError(f"fp8_scaled_mm(): a is [{M}, {K}] but b is [{K2}, {N}]: K differs")
    to_sa, to_sb, sa_t = _scales(M, N, K, scale_a, scale_b)
    k_major = b.stride(0) == 1 and b.stride(1) == K          # b = w.t(), w [N, K] row-major
    to_a = _SAME if a.is_contiguous() else _CONTIGUOUS
    to_b = _TRANSPOSED if k_major else _SAME if b.is_contiguous() else _CONTIGUOUS
    args = (M, N, K, _shape_after(scale_a, to_sa), _shape_after(scale_b, to_sb), k_major,
            bool(use_fast_accum), dtypes.from_torch(a.dtype), dtypes.from_torch(b.dtype),
            dtypes.from_torch(out_dtype), sa_t)
    return args, Operands(("a", "sa", "b", "sb"), (to_a, to_sa, to_b, to_sb))


def _shape_after(scale: torch.Tensor, steps: tuple[str, ...]) -> tuple[int, ...]:
    """The shape of the operand ``steps`` make of a scale tensor (``_scales``'s steps)."""
    shape = tuple(scale.shape) or (1,)
    return shape[::-1] if steps[:1] == _TRANSPOSED else shape


def kernel_inputs(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype = torch.bfloat16, use_fast_accum: bool = False):
    """(the arguments of ``scaled_mm_kernel``, the operands its kernel takes before C) for these
    inputs of ``fp8_scaled_mm`` (``kernel_mapping``)."""
    args, operands = kernel_mapping(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    return args, operands(a, b, scale_a, scale_b)


Call = Callable[..., torch.Tensor]
# the hot path's one lookup: each input's shape, strides, dtype and device (bias: None or its),
# out_dtype and use_fast_accum -> the call for that kind; only checked kinds are stored
_calls: dict[tuple, Call] = {}


def fp8_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  bias: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.bfloat16,
                  use_fast_accum: bool = False) -> torch.Tensor:
    """``(a @ b)`` scaled by ``scale_a`` / ``scale_b``, as ``torch._scaled_mm``: a [M, K], b
    [K, N] FP8 (float8_e4m3fn / float8_e5m2, may differ); float32 scales per tensor, per row of a /
    column of b, or block-wise; ``bias`` [N] is added to the scaled float32 result in the kernel's
    epilogue (one rounding into ``out_dtype``);
    ``use_fast_accum=False`` promotes the tensor cores' FP8 partial sums into float32 every 128
    of K.

    The first call of a kind (each input's shape, strides, dtype and device, ``out_dtype``,
    ``use_fast_accum``) checks the inputs (errors name the argument), compiles or finds the
    kernel and keeps a call for the kind: the mapping of the inputs onto the kernel's operands
    and the kernel's binding fixed to their signature (``Kernel.bound``). A later call of the
    kind is one key, one lookup and that call. Under ``torch.compile`` it is the custom op
    ``tilews::fp8_scaled_mm`` (below)."""
    if torch.compiler.is_compiling():
        return torch.ops.tilews.fp8_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)
    try:
        key = (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
               scale_a.shape, scale_a.stride(), scale_a.dtype, scale_a.device,
               scale_b.shape, scale_b.stride(), scale_b.dtype, scale_b.device,
               None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
               out_dtype, use_fast_accum)
        call = _calls[key]
    except KeyError:
        return _first_call(key, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)
    except (AttributeError, TypeError):     # not tensors, or unhashable: say which
        args, _ = kernel_mapping(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
        _check_bias(bias, args[1], a.device)
        raise
    return call(a, b, scale_a, scale_b, bias)


def _first_call(key, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum) -> torch.Tensor:
    """A new kind of call (``key``): checked, run, and its call kept for the kind. A bias goes
    into the kernel's epilogue, as it is where its dtype is one a result may have and it is
    contiguous, else converted to ``out_dtype`` (contiguous) per call."""
    args, _ = kernel_mapping(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    M, N, K = args[:3]
    _check_bias(bias, N, a.device)
    if M == 0 or N == 0 or K == 0:
        def call(a, b, sa, sb, bias):
            out = torch.zeros(M, N, dtype=out_dtype, device=a.device)
            return out if bias is None else out.add_(bias.to(out_dtype))
    else:
        tiles = _tiles_for(args, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)
        args, operands = tiled_kernel_mapping(tiles, a, b, scale_a, scale_b, out_dtype,
                                              use_fast_accum)
        exprs, with_bias = operands.exprs(), {}
        if bias is not None:
            as_is = bias.dtype in _OUT and bias.is_contiguous()
            exprs.append("bias" if as_is else "bias.to(out_dtype).contiguous()")
            with_bias["bias_dtype"] = dtypes.from_torch(bias.dtype if as_is else out_dtype)
        scratch = split_scratch(tiles, *args[:2])     # the kernel's M, N (swapped or not)
        if scratch is not None:
            exprs.append("*scratch(a.device)")
        kernel = scaled_mm_kernel(*args, tiles.hints() if tiles else (), **with_bias)
        call = _kept_call(kernel, exprs, a, b, scale_a, scale_b, bias,
                          {"out_dtype": out_dtype, "scratch": scratch})
    result = call(a, b, scale_a, scale_b, bias)
    remember(_calls, key, call)
    return result


def _kept_call(kernel, exprs: list[str], a, b, scale_a, scale_b, bias, scope: dict) -> Call:
    """The kept call of a kind: ``kernel`` launched on its operands ``exprs`` (source, of a, b,
    sa, sb, bias and the names in ``scope``), bound to the signature these inputs give them, in
    one generated function (no call per operand or step)."""
    listed = "".join(e + ", " for e in exprs)
    exec(f"def operands(a, b, sa, sb, bias):\n    return ({listed})\n"     # noqa: S102
         f"def call(a, b, sa, sb, bias):\n    return launch({listed})", scope)
    scope["launch"] = kernel.bound(scope["operands"](a, b, scale_a, scale_b, bias))
    return scope["call"]


def _check_bias(bias, N: int, device: torch.device) -> None:
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (N,)
                             or bias.device != device):
        raise ValueError(f"fp8_scaled_mm(): bias must be a [{N}] tensor on {device}")


# --- tuning ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiles:
    """Tile hints of the whole GEMM (``T.fp8_scaled_matmul``'s ``block_M``, ``block_N``,
    ``num_stages``, ``threads`` and ``splits``, K slices summed in the kernel); ``str`` writes
    ``64x128 s8 t128`` (``64x64 s12 t128 x2`` split), ``from_text`` reads it (the spaces
    optional: ``64x128s8t128`` fits a comma-separated command-line list)."""
    block_M: int
    block_N: int
    num_stages: int
    threads: int
    splits: int = 1
    swap_ab: bool = False

    def __str__(self) -> str:
        text = f"{self.block_M}x{self.block_N} s{self.num_stages} t{self.threads}"
        return text + (f" x{self.splits}" if self.splits > 1 else "") + (" swap" if self.swap_ab else "")

    @classmethod
    def from_text(cls, text: str) -> "Tiles":
        match = re.fullmatch(r"(\d+)x(\d+) ?s(\d+) ?t(\d+)(?: ?x(\d+))?( ?swap)?", text.strip()) \
            if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"Tiles.from_text: {text!r} is not a tiling (expected e.g. '64x128 s8 t128', "
                             f"'64x64 s12 t128 x2' or '64x16 s12 t128 swap')")
        *sizes, splits, swap = match.groups()
        return cls(*map(int, sizes), int(splits or 1), bool(swap))

    def hints(self) -> tuple:
        """As ``scaled_mm_kernel``'s ``tiles``: (name, value) pairs (``splits`` only above 1;
        ``swap_ab`` as ``transpose_C``: the swapped product's kernel stores C transposed)."""
        sizes = tuple((k, v) for k, v in vars(self).items() if k not in ("splits", "swap_ab"))
        return sizes + ((("splits", self.splits),) if self.splits > 1 else ()) + \
            ((("transpose_C", True),) if self.swap_ab else ())


# the tuned tilings per tuning key (see _tuning_key): this process's, and the disk's
_winners = Winners("fp8_scaled_mm", Tiles.from_text)


def _granularity(args: tuple):
    M, N, K, sa_shape, sb_shape = args[:5]
    return granularity(M, N, K, sa_shape[::-1] if args[10] else sa_shape, sb_shape)


def _tuning_key(args: tuple, device: torch.device) -> tuple:
    """What a tuned tiling is kept for: the device, the granularity and the kernel's arguments
    but M, whose bucket stands for it (``schedule.bucket``)."""
    M, N, K, sa_shape, sb_shape, k_major, fast, a_dtype, b_dtype, out, sa_t = args
    gran = _granularity(args)
    return (device_name(device), str(a_dtype), str(b_dtype), str(out), gran.a.name, gran.b.name,
            k_major, fast, sa_t, N, K, bucket(M))


def _tiles_for(args, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum) -> Optional[Tiles]:
    """The tiling of a new kind of call: the tuned one of its key, else (``TILEWS_TUNE=1``) one
    tuned now on these inputs, else ``default_tiles``."""
    settings = Settings.from_env()
    tiles = _winners.get(_tuning_key(args, a.device), settings)
    if tiles is None and settings.tune:
        tiles = tune_fp8(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    return tiles or default_tiles(args, a.device, bias is not None)


def default_tiles(args: tuple, device: torch.device, bias: bool = False) -> Optional[Tiles]:
    """The untuned tiling of ``scaled_mm_kernel``'s ``args`` on ``device`` (``bias``: the call
    adds one): on a CUDA device where the kernel compiles for Hopper's wgmma path,
    ``swap_tiles``, else ``split_tiles``; elsewhere None (the intrinsic's choice per shape,
    ``tilews.language.fp8._tiles``)."""
    M, N, K, _, _, k_major, fast, _, _, out = args[:10]
    if device.type != "cuda" or targets.resolve(scaled_mm_kernel.target)[0] != "hopper" \
            or not (k_major and bulk_copy_rows(K) and bulk_copy_rows(N * out.itemsize)):
        return None
    gran = _granularity(args)
    sms = tilews.num_sms()
    return (None if bias else swap_tiles(M, N, gran, sms)) or split_tiles(M, N, K, gran.block_wise, sms)


# The product of a few rows swapped (C^T = B A^T, C stored transposed by the kernel) where the
# scales are per tensor: the rows become the narrow N side of the tiles, so each k-step's wgmma
# and promotion cover 16, 32 or 64 columns instead of a 64-row tile mostly empty, and the blocks
# that share a weight tile are neighbours in launch order. H200, tensorwise, against
# `_scaled_mm` (L2 flushed per call, `scripts/tune_fp8.py`, 5 rounds): M = 16 at N x K = 4096 x
# 4096 / 4096 x 14336 / 14336 x 4096: 0.93 / 1.00 / 0.94x swapped against 0.79 / 0.92 / 0.92x.
# At N x K = 4096 x 4096 / 4096 x 14336: M = 32 in 64 x 32 tiles, 16 stages, 0.93 / 0.94x (12
# stages: 0.91x at 4096 x 14336); M = 64 in 64 x 64 tiles 0.98 / 0.93x against 0.93 / 0.90x
# (split in 2); M = 128 in 64 x 64 tiles (as many blocks as the unswapped 64 x 64 ones) 0.96 /
# 0.98x against 0.82 / 0.83x. Where the swapped tiles outnumber the SMs the unswapped ones win
# (128 x 14336 x 4096: 0.70x swapped, 0.95x in 128 x 128 tiles). cuBLAS runs the same form
# (its kernels' tiles: 64 x 8 at M = 16, 48 x 64 at M = 64, 64 x 64 at M = 128).
SWAP_MOST_ROWS = 128
_SWAP_TILES = ((16, Tiles(64, 16, 12, 128, swap_ab=True)), (32, Tiles(64, 32, 16, 128, swap_ab=True)),
               (SWAP_MOST_ROWS, Tiles(64, 64, 12, 128, swap_ab=True)))


def swap_tiles(M: int, N: int, gran, num_sms: int) -> Optional[Tiles]:
    """The swapped tiling (``swap_ab``) where both scales are per tensor, N fills at least one
    64-row tile and M <= ``SWAP_MOST_ROWS``: the first of ``_SWAP_TILES`` whose width holds M,
    kept above 32 rows only where its tiles fit one wave of ``num_sms``; else None."""
    if M > SWAP_MOST_ROWS or N < 64 or gran.a is not Scaling.TENSOR or gran.b is not Scaling.TENSOR:
        return None
    rows, tiles = next((rows, t) for rows, t in _SWAP_TILES if M <= rows)
    if rows > 32 and -(-N // tiles.block_M) * -(-M // tiles.block_N) > num_sms:
        return None
    return tiles


def tiled_kernel_mapping(tiles: Optional[Tiles], a, b, scale_a, scale_b,
                         out_dtype=torch.bfloat16, use_fast_accum: bool = False):
    """``kernel_mapping`` of the product ``tiles`` computes: as given, or swapped (``swap_ab``:
    the kernel's A is b's [N, K] rows, its B is a, their per-tensor scales trade places, and its
    C [N', M'] is the caller's [M, N]); the operand function still takes the caller's (a, b,
    scale_a, scale_b)."""
    if tiles is None or not tiles.swap_ab:
        return kernel_mapping(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    args, operands = kernel_mapping(b.t(), a.t(), scale_b, scale_a, out_dtype, use_fast_accum)
    return args, operands.swapped()


# Split K (``T.fp8_scaled_matmul``'s ``splits``) where the whole GEMM's tiles leave SMs idle: at
# M <= 64 and N = 4096 the intrinsic's 64 x 64 tiles are 64 blocks on 132 SMs, each a chain of
# K / 128 promoted wgmmas (H200, 3 rounds, against tensorwise ``_scaled_mm``: 16 x 4096 x 4096
# 0.75x, 16 x 4096 x 14336 0.78x, 64 x 4096 x 4096 0.91x; narrower 64 x 32 tiles, 128 blocks:
# 0.73 / 0.71 / 0.96x). Split, the blocks fill the SMs and each chain is shorter; the slices'
# float32 partials are summed by the block arriving last, which scales the sum once. Only long
# chains pay for that sum (H200, `scripts/tune_fp8.py`, 3 rounds): 16 x 4096 x 14336 tensorwise
# 0.80x -> 0.92x in 2 slices of 56 k-blocks (0.90x in 4), rowwise 1.22x -> 1.40x; but 16 and
# 64 x 4096 x 4096 in 2 slices of 16 k-blocks 0.75x -> 0.38x and 0.85x -> 0.66x.
SPLIT_TILE = Tiles(64, 64, 12, 128)
SPLIT_FILL = 0.75           # below this many of the intrinsic's tiles per SM, K is split
SPLIT_MIN_K_BLOCKS = 48     # each slice at least this many 128-deep k-blocks
SPLIT_MOST = 4


def split_tiles(M: int, N: int, K: int, block_wise: bool, num_sms: int) -> Optional[Tiles]:
    """``SPLIT_TILE`` in the slice count nearest one block per SM (at least 2, at most
    ``SPLIT_MOST``, each slice ``SPLIT_MIN_K_BLOCKS`` long) where M fits its 64 rows, the scales
    are per tensor or per row / column and its tiles number below ``SPLIT_FILL`` per SM (where
    they do, so do the intrinsic's own); else None."""
    tiles = -(-N // SPLIT_TILE.block_N)
    if block_wise or M > SPLIT_TILE.block_M or tiles >= SPLIT_FILL * num_sms:
        return None
    most = min(SPLIT_MOST, scale_blocks(K) // SPLIT_MIN_K_BLOCKS)
    splits = min(most, max(2, round(num_sms / tiles)))
    return dataclasses.replace(SPLIT_TILE, splits=splits) if splits >= 2 else None


def split_scratch(tiles: Optional[Tiles], M: int, N: int):
    """For a split tiling, a function of the device giving a call's (arrival counters,
    workspace) operands (this stream's counters; a fresh workspace); None otherwise."""
    if tiles is None or tiles.splits == 1:
        return None
    count = -(-M // tiles.block_M) * -(-N // tiles.block_N)
    shape = split_workspace_shape(M, N, tiles.block_N, tiles.splits)

    def scratch(device: torch.device) -> tuple:
        return arrival_counters(device, count), torch.empty(shape, dtype=torch.float32, device=device)
    return scratch


def tune_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16, use_fast_accum: bool = False, *,
             warmup: float = 25, rep: float = 100) -> Tiles:
    """Time the whole GEMM's tilings (``tilews.language.fp8.tile_candidates`` for the target the
    op's kernel compiles for) on these inputs of ``fp8_scaled_mm`` and keep the fastest for their
    key (the device, dtypes, granularity and scale layouts, N, K and M's bucket), in this process
    and on disk; returns it. Candidates are checked against a float32 torch product of the
    scaled inputs and dropped as ``tilews.ops.tune`` drops schedules (``winners.fastest``).
    Calls of kinds made before pick the winner up (the op's cached calls are cleared)."""
    args, operands = kernel_mapping(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    M, N, K = args[:3]
    if M == 0 or N == 0 or K == 0:
        raise ValueError(f"tune_fp8(): nothing to tune in an empty product (M, N, K = {M}, {N}, {K})")
    inputs = operands(a, b, scale_a, scale_b)
    target = targets.resolve(scaled_mm_kernel.target)[0]
    promote = not args[6] or _granularity(args).block_wise
    space = [Tiles(**t) for t in tile_candidates(target, args[9], promote, args[5])]
    kernels = compile_each(space, lambda t: attempt(scaled_mm_kernel, *args, t.hints()))
    runs = [k if isinstance(k, Exception) else (lambda k=k: k(*inputs)) for k in kernels]
    best, ms = fastest("tune_fp8", space, runs, scaled_product(a, b, scale_a, scale_b, torch.float32),
                       warmup=warmup, rep=rep)
    _winners.put(_tuning_key(args, a.device), best, ms, Settings.from_env())
    _calls.clear()
    return best


def scaled_product(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b)`` in ``dtype`` for inputs of ``fp8_scaled_mm`` (a 1-d
    scale of a is per row, of b per column; block scales spread by ``expand_scale``): the
    bench's float64 reference, ``tune_fp8``'s float32 one."""
    sa = scale_a.to(dtype).reshape(-1, 1) if scale_a.dim() < 2 else scale_a.to(dtype)
    sb = scale_b.to(dtype).reshape(1, -1) if scale_b.dim() < 2 else scale_b.to(dtype)
    return (a.to(dtype) * expand_scale(sa, a.shape)) @ (b.to(dtype) * expand_scale(sb, b.shape))


def expand_scale(scale: torch.Tensor, shape) -> torch.Tensor:
    """``scale`` broadcastable against an operand of ``shape``: a per-tensor or per-row/column
    scale as it is, a 2-d block scale repeated over the 128 elements of each block along each
    dimension it does not match (torch's conventions: b [K, N] has scale_b [K / 128, N / 128])."""
    for dim, size in enumerate(shape):
        if scale.dim() == 2 and scale.shape[dim] not in (1, size):
            scale = scale.repeat_interleave(SCALE_BLOCK, dim=dim).narrow(dim, 0, size)
    return scale


# --- torch.library ---------------------------------------------------------------------------------
@torch.library.custom_op("tilews::fp8_scaled_mm", mutates_args=(),
                         schema="(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
                                "ScalarType out_dtype, bool use_fast_accum) -> Tensor")
def _fp8_scaled_mm_op(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum):
    return fp8_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)


@_fp8_scaled_mm_op.register_fake
def _fp8_scaled_mm_fake(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum):
    args, _ = kernel_mapping(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    M, N = args[:2]
    _check_bias(bias, N, a.device)
    return a.new_empty((M, N), dtype=out_dtype)
