"""Which GEMM program of ``tilews.ops.gemm_programs`` runs a shape, with which knobs.

* ``Schedule``: a program name and its knobs, with a short stable text form (``str(s)``,
  ``Schedule.from_text``): ``"<program> <block_M>x<block_N>x<block_K> s<num_stages> t<threads>"``,
  then ``" x<splits>"`` for split_k and ``" g<group>"`` where a group is set, e.g.
  ``"split_k 64x128x64 s6 t128 x3"``, ``"persistent 128x256x64 s3 t256 g8"``. The blocks are always
  written M x N x K, swap_ab's too (its narrow block is block_M).
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

PROGRAMS = ("tiled", "persistent", "split_k", "swap_ab")
MAX_BUCKET = 8192


@dataclass(frozen=True)
class Schedule:
    """A GEMM program and its knobs. ``splits``: split_k's number of K slices (1 elsewhere);
    ``group``: tiled's block swizzle panel (0: none) or persistent's tile group size (>= 1)."""
    program: str
    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    threads: int
    splits: int = 1
    group: int = 0

    def __post_init__(self):
        if self.program not in PROGRAMS:
            raise ValueError(f"Schedule: program must be one of {', '.join(PROGRAMS)}, got "
                             f"{self.program!r}")
        for f in fields(self)[1:]:
            value, least = getattr(self, f.name), 0 if f.name == "group" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"Schedule: {f.name} must be an int >= {least}, got {value!r}")
        if self.splits != 1 and self.program != "split_k":
            raise ValueError(f"Schedule: splits={self.splits} is split_k's knob, not {self.program}'s")
        if self.program == "persistent" and self.group < 1:
            raise ValueError("Schedule: persistent needs group >= 1 (its tile group size)")

    def __str__(self) -> str:
        text = (f"{self.program} {self.block_M}x{self.block_N}x{self.block_K} s{self.num_stages} "
                f"t{self.threads}")
        if self.program == "split_k":
            text += f" x{self.splits}"
        return text + (f" g{self.group}" if self.group else "")

    @classmethod
    def from_text(cls, text: str) -> "Schedule":
        """The schedule ``str`` wrote; ``ValueError`` quoting ``text`` otherwise."""
        match = _TEXT.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"Schedule.from_text: {text!r} is not a schedule (expected e.g. "
                             f"'tiled 128x128x64 s4 t128 g8' or 'split_k 64x128x64 s6 t128 x4')")
        program, *ints = match.groups()
        bm, bn, bk, stages, threads, splits, group = (int(v) if v else None for v in ints)
        return cls(program, bm, bn, bk, stages, threads, splits or 1, group or 0)

    def output_tiles(self, M: int, N: int) -> int:
        return -(-M // self.block_M) * -(-N // self.block_N)


_TEXT = re.compile(rf"({'|'.join(PROGRAMS)}) (\d+)x(\d+)x(\d+) s(\d+) t(\d+)(?: x(\d+))?(?: g(\d+))?")


def bucket(M: int) -> int:
    """M rounded up to a power of two, capped at ``MAX_BUCKET``; 0 for M <= 0."""
    if M <= 0:
        return 0
    return min(1 << (M - 1).bit_length(), MAX_BUCKET)


# --- the heuristic: its schedules, thresholds and rules -----------------------------------------
CPU = Schedule("tiled", 64, 64, 32, 2, 128)              # the interpreters: small blocks
SWAP_AB_16 = Schedule("swap_ab", 16, 128, 64, 6, 128)
SWAP_AB_32 = Schedule("swap_ab", 32, 128, 64, 6, 128)
SPLIT_K = Schedule("split_k", 64, 128, 64, 6, 128, splits=2)   # splits set per shape
PERSISTENT = Schedule("persistent", 128, 256, 64, 3, 256, group=8)
TILED_128 = Schedule("tiled", 128, 128, 64, 4, 128, group=8)
TILED_64 = Schedule("tiled", 64, 128, 64, 6, 128, group=8)

SWAP_AB_MAX_M = 32          # M at most this: swap_ab (N fills the wgmma's 64 rows)
SPLIT_K_MAX_FILL = 0.5      # SPLIT_K's output tiles below this fraction of the SMs, and ...
SPLIT_K_MIN_K_TILES = 4     # ... K long enough for 2+ slices of at least this many block_K tiles
MAX_SPLITS = 16
PERSISTENT_MIN_WAVES = 1.0  # PERSISTENT's tiles fill the SMs at least this many times
TILED_128_MIN_WAVES = 1.0   # else TILED_128's tiles fill them this many times; else TILED_64
SMEM_BYTES = 227 * 1024     # shared memory of one block on Hopper (stages are cut to fit)


def heuristic(M: int, N: int, K: int, dtype: torch.dtype, out_dtype: torch.dtype, num_sms: int,
              gpu: bool) -> Schedule:
    """The first guess for C[M, N] = A[M, K] @ B[K, N]; the first rule that applies wins:

    ========================================================  =================================
    not on a GPU                                              CPU (tiled 64x64x32)
    M <= SWAP_AB_MAX_M                                        swap_ab 16 (M <= 16) or 32 wide
    SPLIT_K tiles < SPLIT_K_MAX_FILL * num_sms, K allows 2+   split_k, splits filling the SMs
    PERSISTENT tiles >= PERSISTENT_MIN_WAVES * num_sms        persistent 128x256x64
    TILED_128 tiles >= TILED_128_MIN_WAVES * num_sms          tiled 128x128x64
    otherwise                                                 tiled 64x128x64
    ========================================================  =================================

    The pipeline stages are then cut to fit ``SMEM_BYTES`` with the dtypes' sizes."""
    if not gpu:
        return CPU
    if M <= SWAP_AB_MAX_M:
        pick = SWAP_AB_16 if M <= 16 else SWAP_AB_32
    elif (splits := split_count(M, N, K, SPLIT_K, num_sms)) > 1:
        pick = replace(SPLIT_K, splits=splits)
    elif PERSISTENT.output_tiles(M, N) >= PERSISTENT_MIN_WAVES * num_sms:
        pick = PERSISTENT
    elif TILED_128.output_tiles(M, N) >= TILED_128_MIN_WAVES * num_sms:
        pick = TILED_128
    else:
        pick = TILED_64
    return fit_stages(pick, dtype, out_dtype)


def split_count(M: int, N: int, K: int, base: Schedule, num_sms: int) -> int:
    """Slices of K for ``base``'s tiles: enough to fill the SMs, each at least
    ``SPLIT_K_MIN_K_TILES`` k tiles long, at most ``MAX_SPLITS``; 1 (no split) when the output
    tiles already fill ``SPLIT_K_MAX_FILL`` of the SMs."""
    tiles = base.output_tiles(M, N)
    if tiles >= SPLIT_K_MAX_FILL * num_sms:
        return 1
    most = K // (SPLIT_K_MIN_K_TILES * base.block_K)
    return max(1, min(most, MAX_SPLITS, -(-num_sms // tiles)))


def fit_stages(s: Schedule, dtype: torch.dtype, out_dtype: torch.dtype) -> Schedule:
    """``s`` with at most as many stages as fit ``SMEM_BYTES`` (an estimate: the A and B ring,
    plus one output tile in ``out_dtype``, float32 for split_k's partials), at least 1."""
    out_size = 4 if s.program == "split_k" else out_dtype.itemsize
    stage = (s.block_M + s.block_N) * s.block_K * dtype.itemsize
    room = (SMEM_BYTES - s.block_M * s.block_N * out_size) // stage
    return replace(s, num_stages=max(1, min(s.num_stages, room)))


def candidates(M: int, N: int, K: int, dtype: torch.dtype, out_dtype: torch.dtype, num_sms: int,
               gpu: bool) -> list[Schedule]:
    """The schedules ``tilews.ops.tune`` times for this shape: the heuristic's first, then the
    tile shapes, persistent, split_k (2, 4, 8 slices where K allows) and, for M <= 64, swap_ab;
    each at most once. On the CPU a handful of small ones, one per program."""
    first = heuristic(M, N, K, dtype, out_dtype, num_sms, gpu)
    if not gpu:
        space = [Schedule("tiled", 32, 64, 32, 2, 128), Schedule("persistent", 64, 64, 32, 2, 128, group=2)]
        if K > CPU.block_K:
            space.append(Schedule("split_k", 64, 64, 32, 2, 128, splits=2))
        if M <= 64:
            space.append(Schedule("swap_ab", 16, 64, 32, 2, 128))
        return list(dict.fromkeys([first, *space]))
    space = [Schedule("tiled", bm, bn, 64, st, th, group=8) for bm, bn, st, th in
             ((64, 64, 8, 128), (64, 128, 6, 128), (64, 256, 4, 128), (128, 128, 4, 128),
              (128, 256, 3, 256))]
    space += [PERSISTENT, Schedule("persistent", 128, 128, 64, 4, 128, group=8)]
    space += [replace(SPLIT_K, splits=n) for n in (2, 4, 8) if K >= n * SPLIT_K_MIN_K_TILES * SPLIT_K.block_K]
    if M <= 64:
        space += [SWAP_AB_16, SWAP_AB_32, Schedule("swap_ab", 16, 64, 64, 6, 128),
                  Schedule("swap_ab", 64, 128, 64, 6, 128)]
    return list(dict.fromkeys([first, *(fit_stages(s, dtype, out_dtype) for s in space)]))
