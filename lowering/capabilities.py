"""What the machine a backend builds for can do: the ``Capabilities`` passes read, the named
descriptions of the machines tilews knows, and the hardware's rules for bulk (TMA) copies.

Capabilities are facts, not choices: schedule choices are a backend's ``SchedulePolicy`` and code
choices its ``CodegenOptions`` (``lowering/config.py``); which passes run is its pipeline. Emitters
never read them: what they need is decided from these fields and recorded in the IR.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import ir


@dataclass(frozen=True)
class Capabilities:
    name: str                       # the target's name in messages: "interpret" | "triton" |
                                    # "hopper" | "metal"
    warp_specialization: bool       # runs T.ws roles concurrently (else one stream of threads)
    smem_bytes: int                 # shared memory per block
    tma: bool = False               # bulk tensor copies (TMA)
    triton_interpreter: bool = False  # executed by Triton's CPU interpreter
    power_of_two_tiles: bool = False  # tile extents must be powers of two (tl.arange)
    shared_reuse: bool = True       # shared buffers whose lifetimes never overlap may share
                                    # bytes (Metal declares each threadgroup array apart)
    num_sms: int = 0                # multiprocessors, when known (persistent grids); 0: unknown


# The machines tilews builds for. A backend takes one of these (with the SM count of the GPU it
# runs on, where it has one).
# the most shared memory a block has on any GPU tilews builds for (Hopper's 227 KB); the
# interpreter refuses more, so a program it runs fits at least one real target
MAX_GPU_SMEM = 227 * 1024
INTERPRETER = Capabilities("interpret", warp_specialization=True, smem_bytes=MAX_GPU_SMEM)
ANY_TRITON_GPU = Capabilities("triton", warp_specialization=False, smem_bytes=227 * 1024,
                              power_of_two_tiles=True)
TRITON_INTERPRETER = Capabilities("triton", warp_specialization=False, smem_bytes=227 * 1024,
                                  triton_interpreter=True, power_of_two_tiles=True)
SM90 = Capabilities("hopper", warp_specialization=True, smem_bytes=227 * 1024, tma=True)
APPLE_GPU = Capabilities("metal", warp_specialization=False, smem_bytes=32 * 1024,
                         shared_reuse=False)


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
