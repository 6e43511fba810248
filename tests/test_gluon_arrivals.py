"""An arrival of a role of several warp groups waits for all of the role's threads first.

Each warp group waits for its own wgmmas (``warpgroup_mma_wait``); the thread that arrives on a
ring slot's empty barrier speaks for the whole role, so without a barrier of the role's warps
between the other group's wait and the arrival, the producer may refill a slot that group's
wgmma still reads. Triton put such a barrier before an arrival only where its shared-memory
analysis wanted one: in the attention backward's loop its barrier (for a TMA store's wait) came
before the wgmma wait (compile-only SASS). Compile-only: the emitted Gluon source of a merged
consumer role spells ``gl.thread_barrier()`` right before each ``mbarrier.arrive``.
"""
from __future__ import annotations

import re

import pytest

import tilews.language as T
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.ops.attention import blocks as attention_blocks, mha_fwd_program
from tilews.ops.attention_backward import blocks, bwd_program
from tilews.triton_ext.gluon import emit
from tilews.triton_ext.gluon.backend import HOPPER

import examples.gemm as gemm


def roles(source: str) -> dict[str, tuple[int, list[str]]]:
    """Each role function -> (its warp count, from its docstring; its source lines, comments
    left out)."""
    out = {}
    for part in re.split(r"\n@gluon\.jit\n", source)[1:]:
        warps = re.search(r'"""T\.ws\([^)]*\): (\d+) warp', part)
        if warps:
            lines = [ln.strip() for ln in part.splitlines() if not ln.strip().startswith("#")]
            out[part.splitlines()[0]] = (int(warps.group(1)), lines)
    return out


@pytest.mark.parametrize("program, several", [
    (lambda: bwd_program(2, 4, 4, 512, 128, False, 512, dtype=T.float16, **blocks(128, True)), True),
    (lambda: bwd_program(2, 4, 4, 512, 64, False, 512, dtype=T.float16, **blocks(64, True)), False),
    (lambda: gemm.matmul.fn(512, 512, 512, block_M=128, block_N=256, block_K=64, num_stages=3,
                            threads=256, dtype=T.float16), True),
    (lambda: mha_fwd_program(1, 2, 512, 128, True, **attention_blocks(128, True)), False),
], ids=["attention backward D128, one role", "attention backward D64, a role per warp group",
        "GEMM 128x256, merged consumers", "attention forward, split consumers"])
def test_a_merged_roles_arrivals_follow_a_barrier_of_its_threads(program, several):
    """``several``: the program has an arriving role of several warp groups (else one each: its
    own wgmma wait covers the slot, and no barrier is added). Roles of one warp group or less
    (a producer, the backward's dQ reducer) arrive without one."""
    source = emit(lower(build_kernel(program()), HOPPER.replace(num_sms=132)))
    arriving = {head: (warps, [lines[i - 1] for i, ln in enumerate(lines) if ln.startswith("mbarrier.arrive(")])
                for head, (warps, lines) in roles(source).items()}
    arriving = {head: wb for head, wb in arriving.items() if wb[1]}
    assert arriving and any(warps > 4 for warps, _ in arriving.values()) == several, arriving
    for head, (warps, before) in arriving.items():
        assert all((b == "gl.thread_barrier()") == (warps > 4) for b in before), (head, before)
