"""Layouts: where each element of a tile lives, as plain data plus the maps that define them.

* ``WgmmaAccumulator`` — a Hopper warp-group MMA accumulator (and element-wise fragments that
  share it): warps tile M in groups of 16 rows (4 warps = one warp group = 64 rows), then N;
  each instruction covers 16 x n; a thread holds pairs of adjacent columns in rows r and r + 8.
* ``NVMMAShared`` — the swizzled shared-memory layout wgmma and TMA read: rows of the inner
  dimension, 16-byte chunks XOR-permuted within each group of ``swizzle_bytes / 16`` rows.

``element_to_thread`` / ``element_to_offset`` are the definitions; the property tests check that
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
    rows_per_warp, cols_per_warp = M // wm, N // wn
    warp_m, r = divmod(i, rows_per_warp)
    warp_n, c = divmod(j, cols_per_warp)
    # warps are numbered M-fastest within a warp group (4 consecutive warps tile 64 rows)
    warp = warp_m % 4 + 4 * (warp_n + wn * (warp_m // 4))
    rep_m, r16 = divmod(r, 16)
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


def default_shared(rows: int, cols: int, element_bits: int) -> NVMMAShared:
    """The widest swizzle the inner dimension allows (128 B when a row has >= 128 bytes)."""
    row_bytes = cols * element_bits // 8
    for sw in (128, 64, 32):
        if row_bytes % sw == 0:
            return NVMMAShared(sw, element_bits)
    return NVMMAShared(0, element_bits)
