"""Layouts: where each element of a tile lives, as plain data plus the maps that define them.

* ``WgmmaAccumulator`` — a Hopper warp-group MMA accumulator (and element-wise fragments that
  share it): warps tile M in groups of 16 rows (4 warps = one warp group = 64 rows), then N;
  each instruction covers 16 x n; a thread holds pairs of adjacent columns in rows r and r + 8.
* ``NVMMAShared`` — the swizzled shared-memory layout wgmma and TMA read: rows of the inner
  dimension, 16-byte chunks XOR-permuted within each group of ``swizzle_bytes / 16`` rows.

* ``RowSlice`` — a vector along one dimension of a 2-d layout, each element held by the threads
  holding that row (dim 1 removed) or column (dim 0 removed) of the parent: reductions along a
  row of a wgmma accumulator land in it without data movement.
* ``WgmmaOperandA`` — the A operand of a wgmma read from registers (attention's P), for a gemm
  whose accumulator has layout ``parent``: for 16-bit operands each thread holds exactly the
  elements it holds of a same-shaped accumulator (``operand_a_to_thread``), so an accumulator
  cast to 16 bits becomes an operand without leaving its registers.
* ``Blocked`` — the plain element-wise layout of a fragment nothing above constrains.

``element_to_thread`` / ``element_to_offset`` / ``operand_a_to_thread`` are the definitions; the property tests check that
they are bijections onto (thread, register) pairs and byte offsets, and that swizzles are
permutations. ``warp_partition_ok`` is docs/ws-semantics.md #3.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WgmmaAccumulator:
    warps_per_cta: tuple[int, int]      # (warps along M, warps along N)
    instr_shape: tuple[int, int, int]   # (16, n, k) of one wgmma

    @property
    def num_warps(self) -> int:
        return self.warps_per_cta[0] * self.warps_per_cta[1]


@dataclass(frozen=True)
class NVMMAShared:
    swizzle_bytes: int                  # 0 (none), 32, 64 or 128
    element_bits: int
    transposed: bool = False
    rank: int = 2                       # 1: a vector (unswizzled)


@dataclass(frozen=True)
class RowSlice:
    dim: int                            # the dimension of the parent that is removed
    parent: object                      # a 2-d layout


@dataclass(frozen=True)
class WgmmaOperandA:
    parent: WgmmaAccumulator            # the accumulator layout of the gemm it feeds
    k_width: int                        # consecutive k elements per thread (32 // bits)


@dataclass(frozen=True)
class Blocked:
    rank: int
    num_warps: int
    vector: int = 1                     # 2-d: consecutive elements of a row per thread
    threads_along_row: int = 32         # 2-d: a warp's threads along a row (the rest down)


def holds_twice(layout, extents: tuple[int, ...]) -> bool:
    """Whether a thread would hold some element of a tile of ``extents`` in two of its registers
    in ``layout``: the layout's per-thread pattern is wider than the tile, so it wraps onto
    itself (a wgmma accumulator of instruction width n over fewer than n columns, or fewer
    than 16 rows; a blocked layout's run of ``vector`` over a shorter row). Repeated elements are
    harmless to loads and stores, not to atomics: Triton 3.6's element atomics drop duplicates
    held by other threads but add a thread's own duplicates twice."""
    if isinstance(layout, WgmmaAccumulator):
        return extents[0] < 16 or extents[-1] < layout.instr_shape[1] if len(extents) == 2 else False
    if isinstance(layout, RowSlice) and isinstance(layout.parent, WgmmaAccumulator):
        return extents[0] < (16 if layout.dim == 1 else layout.parent.instr_shape[1])
    if isinstance(layout, Blocked) and layout.rank == 2 and len(extents) == 2:
        return extents[1] < layout.vector
    return False


def warp_partition_ok(m_warps: int, n_warps: int, role_warps: int, M: int, N: int,
                      wgmma: bool = True) -> bool:
    """docs/ws-semantics.md #3: a GEMM warp partition (m, n) is valid iff m * n is the role's warp count,
    each warp gets whole 16-row / 8-column pieces, and on wgmma whole warp groups tile M."""
    return (m_warps * n_warps == role_warps and m_warps > 0 and n_warps > 0
            and M % (16 * m_warps) == 0 and N % (8 * n_warps) == 0
            and (not wgmma or m_warps % 4 == 0))


def wgmma_instr_n(N: int, n_warps: int = 1) -> int:
    """The widest wgmma n (multiple of 8, <= 256) that divides each warp column's share of N."""
    per = N // n_warps
    for n in range(min(256, per) // 8 * 8, 7, -8):
        if per % n == 0:
            return n
    raise ValueError(f"no wgmma instruction width divides N={N} over {n_warps} warp column(s)")


def accumulator_for(M: int, N: int, role_warps: int, operand_bits: int) -> WgmmaAccumulator:
    """The accumulator layout for an M x N wgmma tile computed by ``role_warps`` warps: M split
    across warp groups first (merged consumer groups), N only when M runs out."""
    for n_warps in (1, 2, 4, 8):
        m_warps = role_warps // n_warps
        if role_warps % n_warps == 0 and warp_partition_ok(m_warps, n_warps, role_warps, M, N):
            return WgmmaAccumulator((m_warps, n_warps), (16, wgmma_instr_n(N, n_warps), 256 // operand_bits))
    raise ValueError(f"no valid warp partition of a {M}x{N} tile over {role_warps} warps "
                     f"(M must be a multiple of 64 per warp group)")


def element_to_thread(layout: WgmmaAccumulator, M: int, N: int, i: int, j: int) -> tuple[int, int]:
    """(thread, register) holding element (i, j) of an M x N accumulator."""
    wm, wn = layout.warps_per_cta
    cols_per_warp = N // wn
    # warps tile M in 16-row pieces, cyclically (warp m holds rows 16 m + 16 wm * rep); warps
    # are numbered M-fastest within a warp group (4 consecutive warps tile 64 rows)
    rep_m, rest = divmod(i, 16 * wm)
    warp_m, r16 = divmod(rest, 16)
    warp_n, c = divmod(j, cols_per_warp)
    warp = warp_m % 4 + 4 * (warp_n + wn * (warp_m // 4))
    rep_n, c8 = divmod(c, 8)
    lane = (r16 % 8) * 4 + c8 // 2
    reg_in_tile = (r16 // 8) * 2 + c8 % 2
    reps_n = cols_per_warp // 8
    register = (rep_m * reps_n + rep_n) * 4 + reg_in_tile
    return warp * 32 + lane, register


def registers_per_thread(layout: WgmmaAccumulator, M: int, N: int) -> int:
    wm, wn = layout.warps_per_cta
    return (M // wm) * (N // wn) // 32


def element_to_offset(layout: NVMMAShared, rows: int, cols: int, i: int, j: int) -> int:
    """Byte offset of element (i, j) of a ``rows x cols`` tile (inner dimension ``cols``).

    Swizzled tiles are made of atoms of 8 rows x ``swizzle_bytes``; atoms stack along the rows,
    then along the inner dimension. Inside an atom the address bits [4, 7) are XORed with bits
    [7, 10) (CUTLASS's Swizzle<log2(swizzle_bytes / 16), 4, 3>)."""
    elem = layout.element_bits // 8
    byte = j * elem
    if not layout.swizzle_bytes:
        return i * cols * elem + byte
    w = layout.swizzle_bytes
    col_atom, b = divmod(byte, w)
    a = (i % 8) * w + b
    a ^= ((a >> 7) & (w // 16 - 1)) << 4
    return col_atom * rows * w + (i // 8) * 8 * w + a


def default_shared(tile: tuple[int, ...], element_bits: int) -> NVMMAShared:
    """The widest swizzle the inner dimension of a 2-d (or higher) tile allows (128 B when a row
    has >= 128 bytes); a vector is a rank-1 layout, unswizzled (a swizzle permutes rows)."""
    if len(tile) == 1:
        return NVMMAShared(0, element_bits, rank=1)
    row_bytes = tile[-1] * element_bits // 8
    for sw in (128, 64, 32):
        if row_bytes % sw == 0:
            return NVMMAShared(sw, element_bits)
    return NVMMAShared(0, element_bits)


def operand_a_to_thread(layout: WgmmaOperandA, M: int, K: int, i: int, k: int) -> int:
    """The thread holding element (i, k) of an M x K wgmma A operand in registers (16-bit types:
    PTX ISA, "Register fragment for matrix A" of wgmma .m64nNk16): warp w of a warp group holds
    rows [16 w, 16 w + 16) of each 64-row slab it computes; lane l holds rows l // 4 and l // 4 + 8,
    columns 2 (l % 4) + {0, 1} and those + 8 of every 16-wide k slice. With several warp groups
    the slabs go to them in turn, as the parent's warps tile M."""
    if layout.k_width != 2:
        raise ValueError("operand_a_to_thread describes 16-bit operands (k_width 2)")
    wm, wn = layout.parent.warps_per_cta
    if wn != 1:
        raise ValueError("a register A operand needs an accumulator whose warps all tile M")
    warp = (i // 16) % wm              # 64-row slabs go to the warp groups in turn
    lane = (i % 8) * 4 + (k % 8) // 2
    return warp * 32 + lane


def row_slice_threads(layout: RowSlice, M: int, N: int, index: int) -> set[int]:
    """The threads holding element ``index`` of a vector sliced from an M x N wgmma accumulator:
    those holding any element of that row (``dim`` 1) or column (``dim`` 0)."""
    parent = layout.parent
    if not isinstance(parent, WgmmaAccumulator):
        raise ValueError("row_slice_threads describes slices of wgmma accumulators")
    cells = [(index, j) for j in range(N)] if layout.dim == 1 else [(i, index) for i in range(M)]
    return {element_to_thread(parent, M, N, i, j)[0] for i, j in cells}
