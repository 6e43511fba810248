"""Targets: the capabilities ``legalize`` and the other passes read. Emitters never look at the
machine; what they need is decided from these fields and recorded in the IR."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import ir


@dataclass(frozen=True)
class Target:
    name: str                       # "interpret" | "triton" | "hopper" | "metal"
    warp_specialization: bool       # runs T.ws roles concurrently (else: de-specialize)
    tma: bool                       # bulk tensor copies
    wgmma: bool                     # Hopper warp-group MMA
    smem_bytes: int                 # shared memory per block
    triton_interpreter: bool = False  # "triton" executed by Triton's CPU interpreter
    power_of_two_tiles: bool = False  # tile extents must be powers of two (tl.arange)
    num_sms: int = 0                # multiprocessors, when known (persistent grids); 0: unknown
    hangs_on_deadlock: bool = False  # a barrier deadlock hangs it: check_barriers refuses one
    overlap_softmax: bool = False   # schedule choice: overlap_softmax's deferred form applies
    overlap_promotion: bool = False  # schedule choice: overlap_softmax's form for loops whose
                                     # fragment math holds no gemm (FP8 promotion; opt-in)
    pingpong: bool = False          # schedule choice: split consumer warp groups take turns
                                    # issuing their gemms (pingpong; opt-in: 1-5% slower for
                                    # attention on an H100, scripts/tune_attention.py)
    preload_slots: int = 2          # schedule choice: slots of a persistent kernel's per-tile
                                    # preloads (attention's Q): with 2 the next tile's are loaded
                                    # while this one computes (where they fit shared memory)
    staging_per_store: bool = True  # schedule choice: a persistent kernel's epilogue stores
                                    # each result tile through its own staging tile where shared
                                    # memory holds them (overlap_store lets them be in flight
                                    # together), else one per shape, each store waited for
    split_consumers: bool = True    # schedule choice: split_consumers applies (measurements turn
                                    # it off to compare)
    block_syncs: bool = False       # the backend spells block barriers between statements that
                                    # share on-chip memory across threads (insert_syncs; Metal)
    double_buffer: bool = False     # T.Pipelined loads the next tile into a second shared buffer
                                    # (double_buffer; targets without asynchronous copies)
    simdgroup_matrix: bool = False  # 8x8 matrices held by a simdgroup of 32 threads (Metal);
                                    # legalize_metal decides where fragments live
    fast_math: bool = False         # code choice (tl.enable_fast_math): fp32 division and square
                                    # root in Triton's approximate forms, else IEEE-rounded
    register_copies: bool = False   # code choice (tl.enable_lower_ldgstg): a producer's global ->
                                    # shared copy that TMA cannot take (rows not 16-byte aligned)
                                    # goes through its warp group's registers instead of refusing


def bulk_copy_rows(row_bytes: int) -> bool:
    """Whether a global tensor with rows of ``row_bytes`` can be a bulk-copy (TMA) operand: its
    row pitch must be a whole number of 16-byte units."""
    return row_bytes % 16 == 0


def wave_use(blocks: int, num_sms: int) -> float:
    """The share of SM slots busy over the waves ``blocks`` take (1.0: the last wave is full)."""
    return blocks / (-(-blocks // num_sms) * num_sms)


def row_bytes(b: ir.Buffer) -> Optional[int]:
    """The pitch of tensor ``b``'s rows in bytes (its last dim times its item size), 0 for a 1-d
    tensor (no rows to pitch), None when a dim after the first is a runtime one."""
    inner = [ir.as_int(d) for d in b.shape[1:]]
    if None in inner:
        return None
    return inner[-1] * b.dtype.itemsize if inner else 0


def bulk_copy_tensor(b: ir.Buffer) -> bool:
    """Whether a bulk (TMA) copy can address tensor ``b``'s rows: static strides, and rows of
    whole 16-byte units (``bulk_copy_rows``) where it has rows."""
    pitch = row_bytes(b)
    return pitch is not None and bulk_copy_rows(pitch)


INTERPRET = Target("interpret", warp_specialization=True, tma=False, wgmma=False, smem_bytes=1 << 30)
TRITON_GPU = Target("triton", warp_specialization=False, tma=False, wgmma=False,
                    smem_bytes=227 * 1024, power_of_two_tiles=True)
TRITON_CPU = Target("triton", warp_specialization=False, tma=False, wgmma=False,
                    smem_bytes=227 * 1024, triton_interpreter=True, power_of_two_tiles=True)
HOPPER = Target("hopper", warp_specialization=True, tma=True, wgmma=True, smem_bytes=227 * 1024,
                hangs_on_deadlock=True, overlap_softmax=True)
METAL = Target("metal", warp_specialization=False, tma=False, wgmma=False, smem_bytes=32 * 1024,
               block_syncs=True, double_buffer=True, simdgroup_matrix=True)
