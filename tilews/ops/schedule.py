"""Which GEMM program of ``tilews.ops.gemm_programs`` runs a shape, with which knobs.

* ``Schedule``: a program name and its knobs, with a short stable text form (``str(s)``,
  ``Schedule.from_text``): ``"<program> <block_M>x<block_N>x<block_K> s<num_stages> t<threads>"``,
  then ``" x<splits>"`` for split_k, ``" g<group>"`` where a group is set and ``" regs"`` where
  tiles whose rows TMA cannot take go through the producer's registers, e.g.
  ``"split_k 64x128x64 s6 t128 x3"``, ``"persistent 128x256x64 s3 t256 g8"``,
  ``"stream_k 128x256x64 s3 t256 g16"``, ``"persistent 128x256x64 s3 t256 g8 regs"``. The
  blocks are always written M x N x K, swap_ab's too (its narrow block is block_M).
* ``heuristic(M, N, K, ...)``: the first guess, by the rules and thresholds at the top of its
  section (the one place they are written; re-tune them from GPU measurements,
  ``scripts/explore_gemm_schedules.py``).
* ``candidates(M, N, K, ...)``: the tuning space of one shape, the heuristic's choice first.
* ``bucket(M)``: the granularity of tuned winners: M rounded up to a power of two, at most
  ``MAX_BUCKET``; 0 for M <= 0 (an empty product, never tuned).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

import torch

from tilews.lowering.capabilities import SM90, bulk_copy_rows, wave_use

PROGRAMS = ("tiled", "persistent", "split_k", "split_k_fused", "swap_ab", "stream_k")
PANELLED = ("persistent", "stream_k")       # their group: the tile panel, at least 1
SPLITTING = ("split_k", "split_k_fused")
MAX_BUCKET = 8192


@dataclass(frozen=True)
class Schedule:
    """A GEMM program and its knobs. ``splits``: the number of K slices of split_k and
    split_k_fused (1 elsewhere);
    ``group``: tiled's block swizzle panel (0: none) or persistent's and stream_k's tile group
    size (>= 1); ``registers``: compiled with pass config ``tl.enable_lower_ldgstg`` (on Hopper,
    a tile whose rows are not whole 16-byte units is loaded by the producer warp group through
    registers, where it would otherwise make the program fall back to ``triton.language``)."""
    program: str
    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    threads: int
    splits: int = 1
    group: int = 0
    registers: bool = False

    def __post_init__(self):
        if self.program not in PROGRAMS:
            raise ValueError(f"Schedule: program must be one of {', '.join(PROGRAMS)}, got "
                             f"{self.program!r}")
        if not isinstance(self.registers, bool):
            raise ValueError(f"Schedule: registers must be a bool, got {self.registers!r}")
        for f in (f for f in fields(self)[1:] if f.name != "registers"):
            value, least = getattr(self, f.name), 0 if f.name == "group" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"Schedule: {f.name} must be an int >= {least}, got {value!r}")
        if self.splits != 1 and self.program not in SPLITTING:
            raise ValueError(f"Schedule: splits={self.splits} is a knob of {' and '.join(SPLITTING)}, "
                             f"not of {self.program}")
        if self.program in PANELLED and self.group < 1:
            raise ValueError(f"Schedule: {self.program} needs group >= 1 (its tile group size)")

    def __str__(self) -> str:
        text = (f"{self.program} {self.block_M}x{self.block_N}x{self.block_K} s{self.num_stages} "
                f"t{self.threads}")
        if self.program in SPLITTING:
            text += f" x{self.splits}"
        return text + (f" g{self.group}" if self.group else "") + (" regs" if self.registers else "")

    @classmethod
    def from_text(cls, text: str) -> "Schedule":
        """The schedule ``str`` wrote; ``ValueError`` quoting ``text`` otherwise."""
        match = _TEXT.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"Schedule.from_text: {text!r} is not a schedule (expected e.g. "
                             f"'tiled 128x128x64 s4 t128 g8' or 'split_k 64x128x64 s6 t128 x4')")
        program, *ints, registers = match.groups()
        bm, bn, bk, stages, threads, splits, group = (int(v) if v else None for v in ints)
        return cls(program, bm, bn, bk, stages, threads, splits or 1, group or 0, bool(registers))

    def output_tiles(self, M: int, N: int) -> int:
        return -(-M // self.block_M) * -(-N // self.block_N)


_TEXT = re.compile(rf"({'|'.join(PROGRAMS)}) (\d+)x(\d+)x(\d+) s(\d+) t(\d+)(?: x(\d+))?(?: g(\d+))?( regs)?")


def bucket(M: int) -> int:
    """M rounded up to a power of two, capped at ``MAX_BUCKET``; 0 for M <= 0."""
    if M <= 0:
        return 0
    return min(1 << (M - 1).bit_length(), MAX_BUCKET)


# --- the heuristic: its schedules, thresholds and rules -----------------------------------------
# Measured on an H100 (scripts/explore_gemm_schedules.py, kernel time under CUDA graphs against
# cuBLAS, bf16): at M <= 32 a 64-row tile wastes most of the wgmma but the shape is bound by
# reading B, so what matters is enough blocks streaming it (split-K when N has few tiles); above
# that, the largest tile whose count still fills most SMs wins (a 64x64 tile at 128x4096x4096:
# 1.2x cuBLAS; 128x128 at 128x14336x4096 and 512x4096x4096), and split-K repairs a last wave that
# would run mostly empty (1000x1100x1234: 0.80x -> 0.94x). With L2 flushed (as tilews-bench times),
# split-K's second kernel costs ~3 us of a ~22 us product at M <= 32, N = K = 4096; summing in the
# same kernel (split_k_fused, scripts/probe_narrow_gemm.py, H100) is worth 0.87 / 0.92 / 0.85x ->
# 0.96 / 1.05 / 0.94x at M = 1 / 16 / 32 there and 0.96x -> 1.01x at K = 14336, with 16- or 32-row
# blocks of 64 columns, 128-deep k tiles, and about one block per SM.
CPU = Schedule("tiled", 64, 64, 32, 2, 128)              # the interpreters: small blocks
SPLIT_K = Schedule("split_k", 64, 128, 64, 6, 128, splits=2)   # splits set per shape
PERSISTENT = Schedule("persistent", 128, 256, 64, 3, 256, group=8)
NARROW_M = (Schedule("tiled", 64, 256, 64, 4, 128, group=8),    # M <= NARROW_M_MAX, N wide
            Schedule("tiled", 64, 128, 64, 6, 128, group=8))
NARROW_SPLIT = Schedule("split_k_fused", 16, 64, 128, 4, 128, splits=2)   # block_M, splits per shape
# M <= 16 where N alone fills half the SMs with 64x256 tiles: 16x128 blocks, K split to about one
# block per SM, beat them on an H200 (scripts/probe_narrow_gemm.py --schedules, 3 interleaved
# rounds, vs cuBLAS: 1x14336x4096 0.97x against 0.92x, 1x14336x14336 0.98x against 0.90x,
# 16x14336x4096 0.93x against 0.92-0.94x): 56 tiles of 64x256 keep 76 SMs idle while B streams
WIDE_SPLIT_N = 128
# rows not 16-byte aligned keep a tensor off TMA: the program runs as plain triton.language.
# With L2 flushed before each call (tilews-bench, ops.tune), K split in two measured best
# (4095x4097x4099 on an H100: split_k 64x128 x2 0.93 ms, transposed 128x64 tiles 1.09 ms,
# tiled 64x128 1.07 ms, cuBLAS 0.85 ms); transposed tiles stay where K is too short to split
UNALIGNED = (replace(SPLIT_K, splits=2), Schedule("swap_ab", 64, 128, 64, 6, 128))
# The warp-specialized alternative, a producer loading such tiles through its registers
# (Schedule.registers), is correct but slower there (H100, 5 rounds, against cuBLAS: 4095x4097x4099
# 0.57x with 128x256 tiles, 0.43x with split_k 64x128 x2; 1000x1100x1234 0.31-0.41x): bf16 rows
# 2-byte aligned take 2-byte loads, and the producer waits on each chunk of rows before storing
# it. Tried by tune only (split_k 64x128 x2 at 777x512x4100: 0.66x, where the heuristic's
# tl tiles reached 0.40x).
REGISTER_STAGED = (Schedule("split_k", 64, 128, 64, 6, 128, splits=2, registers=True),
                   Schedule("tiled", 64, 128, 64, 8, 128, group=8, registers=True))
# Below one tile per SM a product is bound by moving its operands, not by the tensor cores, and
# each SM needs as many bytes in flight as shared memory holds (H100, L2 flushed, 7 rounds:
# 128x4096x4096 with 64x64x64 tiles 0.88x cuBLAS at 8 stages, 0.98x at 12; 512x4096x4096 with
# 128x128x64 tiles 0.89x at 4 stages, 0.95x at 5, 0.98x at 6): the tiles below carry the deepest
# ring that fits.
TILES = (Schedule("tiled", 128, 256, 64, 3, 256, group=8),       # largest first
         Schedule("tiled", 128, 128, 64, 6, 128, group=8),
         Schedule("tiled", 64, 256, 64, 4, 128, group=8),
         Schedule("tiled", 64, 128, 64, 8, 128, group=8),
         Schedule("tiled", 64, 64, 64, 12, 128, group=8))

# stream_k (the last partial wave's tiles shared out by k iterations) on an H100, L2 flushed, 5
# rounds against cuBLAS, whole tiles first (scripts/probe_stream_k.py): 8192^3 1.06x (1521 us)
# where persistent 128x256 g8 was 1.02x (1552 us; last wave 52% full); 4096^3 0.91x against
# 0.99x (last wave 88% full; shared segments first, 2048x14336x4096 (79%) 0.89-0.91x against
# 0.96x): the partials' float32 traffic costs more than a nearly full last wave loses. Tried
# (tuning space only) where the last wave of 128x256 tiles is at most this full.
STREAM_K = Schedule("stream_k", 128, 256, 64, 3, 256, group=16)
STREAM_K_MAX_TAIL = 0.6

NARROW_M_MAX = 32           # M at most this: 64-row tiles over N, or split-K
FILL = 0.75                 # a tiling "fills" the GPU with at least this many blocks per SM
NARROW_FILL = 1.0           # blocks per SM split_k_fused aims at when M <= NARROW_M_MAX
FUSED_MIN_K_TILES = 4       # each K slice of split_k_fused at least this many block_K tiles long
MIN_WAVE_USE = 0.8          # below this share of its SM slots busy, a tiling is split in K
SPLIT_K_MIN_K_TILES = 6     # each K slice at least this many block_K tiles long
MAX_SPLITS = 16
REBALANCE_SPLITS = 3        # at most this many slices to even out a tiling that fills the SMs
SMEM_BYTES = SM90.smem_bytes   # shared memory of one block on Hopper (stages are cut to fit)


# float32 operands run on the tl path on Hopper (the programs' N-major B tiles keep wgmma's tf32
# form off: it needs K-major tiles), where the 16-bit tiles hold one or two stages of 64-wide
# k-blocks and, for exact products, FMA a 128x256 tile at ~1.5 TFLOP/s. Measured on an H200
# (scripts/probe_float32_matmul.py, 3 interleaved rounds, ratio to torch.matmul at 4096^3 /
# 1000x1100x1234): exact, 64x128x32 0.89x / 0.60x (the 16-bit pick: 0.03x / 0.13x); TF32,
# 128x128x32 with two warp groups 0.22x / 0.87x (0.21x / 0.34x). For M <= NARROW_M_MAX the
# 16-bit narrow picks stay (16x4096x4096: 1.15x TF32, 2.65x exact).
FLOAT32 = {"ieee": Schedule("tiled", 64, 128, 32, 4, 128),
           "tf32": Schedule("tiled", 128, 128, 32, 4, 256)}


def heuristic(M: int, N: int, K: int, dtype: torch.dtype, out_dtype: torch.dtype, num_sms: int,
              gpu: bool, precision: str = "tf32") -> Schedule:
    """The first guess for C[M, N] = A[M, K] @ B[K, N]; the first rule that applies wins:

    ==========================================================  ===============================
    not on a GPU                                                CPU (tiled 64x64x32)
    M <= 16, 16-bit, N's 64x256 (64x128) tiles fill half        split_k_fused 16 x 128 x 128
    M <= NARROW_M_MAX, N's 64x256 (else 64x128) tiles fill      tiled 64x256 (64x128)
    M <= NARROW_M_MAX                                           split_k_fused 16 (32) x 64 x 128,
                                                                NARROW_FILL blocks per SM
    float32 operands                                            FLOAT32[precision]
    128x256 tiles at least one per SM                           persistent 128x256x64
    the largest of TILES whose count fills the SMs              that tile, or split_k of it
                                                                when its last wave is mostly
                                                                idle
    none fills                                                  split_k 64x128 filling the SMs,
                                                                else tiled 64x64
    then, rows of A, B or C not a multiple of 16 bytes and a    UNALIGNED: split_k 64x128 x2,
    128-row pick                                                swap_ab 64x128 if K is short
    ==========================================================  ===============================

    "Fills": at least ``FILL`` blocks per SM. The pipeline stages are then cut to fit
    ``SMEM_BYTES`` with the dtypes' sizes."""
    if not gpu:
        return CPU
    fill = FILL * num_sms
    if M <= NARROW_M_MAX:
        wide = next((t for t in NARROW_M if t.output_tiles(M, N) >= 0.5 * fill), None)
        if wide is not None and M <= 16 and dtype is not torch.float32:
            wide = _narrow_split(M, N, K, num_sms, WIDE_SPLIT_N) or wide
        pick = wide or _narrow_split(M, N, K, num_sms) or NARROW_M[-1]
    elif dtype is torch.float32:    # on the tl path: no TMA, so no alignment rule either
        return fit_stages(FLOAT32[precision], dtype, out_dtype)
    elif PERSISTENT.output_tiles(M, N) >= num_sms:
        pick = PERSISTENT
    else:
        tile = next((t for t in TILES if t.output_tiles(M, N) >= fill), None)
        if tile is not None:
            uneven = wave_use(tile.output_tiles(M, N), num_sms) < MIN_WAVE_USE
            pick = (uneven and _split(M, N, K, tile, num_sms, REBALANCE_SPLITS, strict=True)) or tile
        else:
            pick = _split(M, N, K, SPLIT_K, num_sms) or TILES[-1]
    if not _aligned(N, K, dtype, out_dtype) and pick.block_M == 128:
        splits, transposed = UNALIGNED
        pick = splits if _k_splits(splits, K) else transposed
    return fit_stages(pick, dtype, out_dtype)


def _k_splits(s: Schedule, K: int) -> bool:
    """Whether K gives each of split_k schedule ``s``'s slices ``SPLIT_K_MIN_K_TILES`` k tiles."""
    return K >= s.splits * SPLIT_K_MIN_K_TILES * s.block_K


def _aligned(N: int, K: int, dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether TMA can take the rows of A [M, K], B [K, N] and C [M, N]."""
    return all(bulk_copy_rows(n) for n in (K * dtype.itemsize, N * dtype.itemsize, N * out_dtype.itemsize))


def _split(M: int, N: int, K: int, tile: Schedule, num_sms: int, most: int = MAX_SPLITS,
           strict: bool = False):
    """split_k with ``tile``'s blocks and ``split_count`` slices, or None when K allows no split
    (``strict``: nor when no count up to ``most`` meets the fill and wave rules)."""
    splits = split_count(M, N, K, tile, num_sms, most, strict)
    return None if splits < 2 else Schedule("split_k", tile.block_M, tile.block_N, tile.block_K,
                                            tile.num_stages, 128 if tile.block_M == 64 else tile.threads,
                                            splits=splits)


def _narrow_split(M: int, N: int, K: int, num_sms: int, block_N: int = NARROW_SPLIT.block_N):
    """split_k_fused for M <= NARROW_M_MAX (16-row blocks up to M = 16, else 32) with ``block_N``
    columns: the slice count nearest ``NARROW_FILL`` blocks per SM (reading B is the bound; more
    slices only add partial sums), or None when K allows no split."""
    base = replace(NARROW_SPLIT, block_M=16 if M <= 16 else 32, block_N=block_N)
    tiles = base.output_tiles(M, N)
    most = min(MAX_SPLITS, K // (FUSED_MIN_K_TILES * base.block_K))
    splits = min(most, max(2, round(NARROW_FILL * num_sms / tiles)))
    return replace(base, splits=splits) if splits >= 2 else None


def split_count(M: int, N: int, K: int, base: Schedule, num_sms: int, most: int = MAX_SPLITS,
                strict: bool = False) -> int:
    """Slices of K for ``base``'s tiles: the fewest that make the blocks fill the SMs (``FILL``)
    with their SM slots at least ``MIN_WAVE_USE`` busy, each slice at least
    ``SPLIT_K_MIN_K_TILES`` k tiles long, at most ``most``; failing that, enough to fill the SMs
    as far as K allows (``strict``: 1, no split); 1 when K allows no split."""
    tiles = base.output_tiles(M, N)
    most = min(most, K // (SPLIT_K_MIN_K_TILES * base.block_K))
    for splits in range(2, most + 1):
        blocks = tiles * splits
        if blocks >= FILL * num_sms and wave_use(blocks, num_sms) >= MIN_WAVE_USE:
            return splits
    return 1 if strict else max(1, min(most, -(-int(FILL * num_sms) // tiles)))


def fit_stages(s: Schedule, dtype: torch.dtype, out_dtype: torch.dtype) -> Schedule:
    """``s`` with at most as many stages as fit ``SMEM_BYTES`` (an estimate: the A and B ring,
    plus one output tile in ``out_dtype``, float32 for split-K's partials), at least 1."""
    out_size = 4 if s.program in SPLITTING else out_dtype.itemsize
    stage = (s.block_M + s.block_N) * s.block_K * dtype.itemsize
    room = (SMEM_BYTES - s.block_M * s.block_N * out_size) // stage
    return replace(s, num_stages=max(1, min(s.num_stages, room)))


def candidates(M: int, N: int, K: int, dtype: torch.dtype, out_dtype: torch.dtype, num_sms: int,
               gpu: bool, precision: str = "tf32") -> list[Schedule]:
    """The schedules ``tilews.ops.tune`` times for this shape: the heuristic's first, then the
    tile shapes, persistent, stream_k (where 128x256 tiles leave a last wave at most
    ``STREAM_K_MAX_TAIL`` full), split_k (2, 3, 4, 8 slices where K allows), split_k_fused (64x128
    blocks in 2 and 4 slices; for M <= 64 also blocks of M's height: 64x128 in 2 and 4 slices,
    128x64 in 4), for M <= 64, swap_ab, and where TMA cannot take the rows, ``REGISTER_STAGED``;
    each at most once. On the CPU a handful of small
    ones, one per program."""
    first = heuristic(M, N, K, dtype, out_dtype, num_sms, gpu, precision)
    if not gpu:
        space = [Schedule("tiled", 32, 64, 32, 2, 128), Schedule("persistent", 64, 64, 32, 2, 128, group=2),
                 Schedule("stream_k", 32, 64, 32, 2, 128, group=2)]
        if K > CPU.block_K:
            space += [Schedule("split_k", 64, 64, 32, 2, 128, splits=2),
                      Schedule("split_k_fused", 16, 64, 32, 2, 128, splits=2)]
        if M <= 64:
            space.append(Schedule("swap_ab", 16, 64, 32, 2, 128))
        return list(dict.fromkeys([first, *space]))
    space = [*TILES, PERSISTENT, Schedule("persistent", 128, 128, 64, 4, 128, group=8)]
    tiles = STREAM_K.output_tiles(M, N)
    if tiles >= num_sms and 0 < tiles % num_sms <= STREAM_K_MAX_TAIL * num_sms:
        space.append(STREAM_K)
    space += [s for s in (replace(SPLIT_K, splits=n) for n in (2, 3, 4, 8)) if _k_splits(s, K)]
    fused = [Schedule("split_k_fused", 64, 128, 64, 4, 128, splits=n) for n in (2, 4)]
    if M <= 64:
        height = 16 if M <= 16 else 32 if M <= 32 else 64
        fused += [Schedule("split_k_fused", height, bn, bk, 4, 128, splits=n)
                  for bn, bk, n in ((64, 128, 2), (64, 128, 4), (128, 64, 4))]
        space += [Schedule("swap_ab", bm, bn, 64, 6, 128) for bm, bn in ((16, 128), (32, 128), (16, 64))]
    space += [f for f in fused if K >= f.splits * FUSED_MIN_K_TILES * f.block_K]
    if not _aligned(N, K, dtype, out_dtype):
        space += [s for s in REGISTER_STAGED if s.splits == 1 or _k_splits(s, K)]
    if dtype is torch.float32:
        space += FLOAT32.values()
    return list(dict.fromkeys([first, *(fit_stages(s, dtype, out_dtype) for s in space)]))
