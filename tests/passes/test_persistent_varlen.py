"""The varlen attention forward made persistent on Hopper (persist over a grid sized at launch:
``ceil(max_seqlen_q / block_M)`` x heads x batch), compile-only and on the interpreter.

* The lowered kernel is one block per SM over a tile loop, still warp-specialized, and means the
  program: the interpreter runs it under several schedules, on 3 SMs (and on more SMs than
  tiles), equal to the program before lowering and close to a float64 reference, with sequences
  of different lengths (one shorter than a block, an empty one, one of exactly two blocks),
  causal or not, with the LSE.
* A tile past its sequence's end does nothing: it stores no LSE row (they stay poisoned), and
  its Q tile (the producer's unconditional preload) starts past Q's last row.
* A query block wholly inside its sequence leaves through a bulk (TMA) store, a sequence's last
  partial block through masked element stores read back from the staged tile (16-byte runs of
  rows, each split consumer its rows), with the bulk stores' waits still deferred and the
  softmax overlap kept; Triton compiles the kernel for sm_90a with no spill (causal D 128,
  non-causal D 64) or at most 8 bytes (non-causal D 128, 16 heads; 88 before).
* sm_90a SASS: each consumer's non-causal K/V loop has no mask (the ragged block is visited
  first) and no run of moves shifting P's registers before the P V wgmma (the ragged store's row
  written as the start plus the mask's row).
* Varlen decoding (a 2-d grid whose loop bounds read ``cu[b]``, ``b`` its fastest index) is still
  left one block per tile (tests/test_decode_gluon.py).
"""
from __future__ import annotations

import functools
import math
import re

import pytest
import torch

from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.layouts import Blocked
from tilews.lowering.plans import AsyncPlan, LayoutPlan
from tilews.lowering.simplify import fold
from tilews.lowering.traverse import exprs_of, subexprs, walk
from tilews.ops.attention import lse_rows, mha_fwd_varlen_program
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.triton_ext import toolchain
from tilews.triton_ext.toolchain import ptxas_report

from ..helpers import gluon_program, innermost_loops, poisoned, roles
from ..test_attention_varlen import close, inputs, reference

H, KV_H, D, BLOCK_M = 2, 1, 32, 128
# a sequence of 2 whole blocks, an empty one, one shorter than a block, one of 1 block + 2 rows
LQ, LK = [256, 0, 50, 130], [256, 7, 64, 100]


def program(causal, dim=D, **blocks):
    blocks = blocks or dict(block_M=BLOCK_M, block_N=64, num_stages=2, threads=256)
    return mha_fwd_varlen_program(H, KV_H, dim, causal, store_lse=True, **blocks)


@functools.lru_cache(maxsize=None)
def lowered(causal, sms=3):
    return lower(build_kernel(program(causal)), HOPPER.replace(num_sms=sms))


def run(kernel, q, k, v, cu_q, cu_k, seed=0):
    """(out, lse) of ``kernel`` (the program's parameters, runtime dims included), both poisoned
    before the run."""
    out = poisoned(*q.shape, dtype=q.dtype)
    lse = poisoned(len(cu_q) - 1, H, lse_rows(max(LQ), BLOCK_M))
    interpreter.run(kernel, [q.shape[0], q, k.shape[0], k, v, len(cu_q), cu_q, cu_k, max(LQ), out,
                             len(cu_q) - 1, lse.shape[2], lse], seed=seed)
    return out, lse


# 16 tiles (2 query blocks x 2 heads x 4 sequences) over 3 blocks, and over 20 (4 without a tile)
@pytest.mark.parametrize("causal,sms", [(False, 3), (True, 3), (True, 20)])
def test_the_persistent_varlen_forward_means_the_program(causal, sms):
    k = lowered(causal, sms)
    note = next(n for n in k.notes if n.startswith("persist:"))
    assert "sized at launch" in note and "one block per SM" in note, note
    assert [ir.as_int(g) for g in k.grid] == [sms]
    assert k.find_plan(AsyncPlan) is not None, k.notes
    assert any(n.startswith("overlap_softmax") for n in k.notes), k.notes
    args = inputs(LQ, LK, H, KV_H, seed=int(causal))
    want_out, want_lse = run(build_kernel(program(causal)), *args)
    close(want_out, reference(*args[:3], args[3].tolist(), args[4].tolist(), causal,
                              1 / math.sqrt(D))[0], "out")
    for seed in range(3):
        out, lse = run(k, *args, seed=seed)
        assert torch.equal(out, want_out), seed
        assert torch.equal(lse.nan_to_num(7.0), want_lse.nan_to_num(7.0)), seed


def test_a_tile_past_its_sequence_stores_nothing():
    """max_seqlen_q 256: two query blocks for every sequence; the second block of the 50-row and
    130-row sequences holds rows of theirs only in the 130's, so the 50's (and the empty
    sequence's two) store no LSE row, while a live block stores all its 128. Its Q tile starts
    at Q's row total_q."""
    k = lowered(True)
    q = next(s for s in walk(roles(k)[(0,)].body) if isinstance(s, ir.Copy) and s.src.buffer.name == "Q")
    row = q.src.starts[0]      # past the tensor's last row for such a tile: no memory read
    assert isinstance(row, ir.Select) and isinstance(row.b, ir.Var) and row.b.name == "total_q", row
    args = inputs(LQ, LK, H, KV_H, seed=5)
    _, lse = run(k, *args)
    written = (~lse.isnan()).sum(-1)            # per (sequence, head): rows stored
    assert written[:, 0].tolist() == [256, 0, 128, 256]


def test_whole_blocks_leave_through_a_bulk_store():
    k = lower(build_kernel(program(False)), HOPPER.replace(num_sms=3))
    for g, role in roles(k).items():
        if g == (0,):
            continue
        bulk = [s for s in walk(role.body) if isinstance(s, ir.Copy) and s.dst.buffer.name == "Output"]
        assert bulk and all(c.mechanism is ir.CopyMechanism.TMA for c in bulk), g
        assert any(isinstance(s, ir.Store) and s.buffer.name == "Output" for s in walk(role.body)), g


def test_the_last_block_stores_from_the_staged_tile():
    """The sequence's last block reads O_shared back in 16-byte runs of its rows (a Blocked
    frame), each split consumer its own 64 rows; the whole blocks' bulk stores still overlap
    the next tile's loop (their waits moved before O_shared's next write) and no proxy fence
    lands in the main loop (the softmax overlap stays)."""
    k = lowered(False)
    frames = dict(k.plan(LayoutPlan).frames)
    assert any(n.startswith("overlap_softmax") for n in k.notes), k.notes
    for g, first in (((1,), 0), ((2,), 64)):
        body = roles(k)[g].body
        (p,) = [s for s in walk(body) if isinstance(s, ir.Parallel)
                and any(isinstance(t, ir.Store) and t.buffer.name == "Output" for t in walk(s.body))]
        (x,) = [x for t in walk(p.body) for e in exprs_of(t) for x in subexprs(e)
                if isinstance(x, ir.Load) and x.buffer.name == "O_shared"]
        assert fold(x.indices[0]) == fold(ir.BinOp(ir.BinOpKind.ADD, p.vars[0], ir.Const(first, ir.DType.I32),
                                                   ir.DType.I32)), x.indices
        assert frames[p.vars[0].name] == Blocked(2, 4, vector=8, threads_along_row=4)
        loop = next(s for s in walk(body) if isinstance(s, ir.For) and s.kind is not ir.ForKind.PERSISTENT)
        assert not any(isinstance(s, ir.ProxyFence) for s in walk(loop.body)), g
        after = [s for s in walk(body) if isinstance(s, ir.Copy) and s.dst.buffer.name == "Output"]
        assert after and all(c.mechanism is ir.CopyMechanism.TMA for c in after)
    assert k.plan(AsyncPlan).shared_chunks, k.plan(AsyncPlan)


# spill bytes ptxas reports (sm_90a, 16 heads, the GPU's blocks): non-causal D 128 stored its last
# block from the accumulator's layout (2-4 bytes a store, 64 addresses a thread) and spilled 88
# bytes; from the staged tile 8 (the split consumer that is not Triton's default partition still
# stores 2 bytes at a time: its pointer's alignment is not known there)
@pytest.mark.parametrize("causal,dim,spilled", [(True, 128, 0), (False, 64, 0), (False, 128, 8)])
def test_the_persistent_varlen_forward_compiles_for_sm90a_without_spills(causal, dim, spilled):
    blocks = dict(block_M=128, block_N=128, num_stages=2, threads=256)
    prog = mha_fwd_varlen_program(16, 16, dim, causal, store_lse=True, **blocks)
    k = lower(build_kernel(prog), HOPPER.replace(num_sms=132))
    assert any(n.startswith("persist:") and "one block per SM" in n for n in k.notes), k.notes
    ptx = gluon_program(k).asm["ptx"]
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.global\.shared::cta", ptx)      # O's bulk store
    assert re.search(r"ld\.shared\.v4\.b32", ptx) and re.search(r"st\.global\.v4\.b32", ptx)
    report = ptxas_report(ptx)
    if report is not None:
        got = int(re.search(r"(\d+) bytes spill stores", report).group(1))
        assert got <= spilled, report


def _sass(prog) -> str:
    """``cuobjdump -sass`` of ``prog`` lowered for 132 SMs and compiled for sm_90a (skips where
    this Triton bundles no ptxas or cuobjdump)."""
    ptx = gluon_program(lower(build_kernel(prog), HOPPER.replace(num_sms=132))).asm["ptx"]
    text = toolchain.sass(ptx)
    if text is None:
        pytest.skip("this Triton bundles no ptxas / cuobjdump")
    return text


# non-causal varlen visits its ragged last K/V block first, so each consumer's K/V loop (16 wgmmas:
# Q K^T and P V) has no mask in it (it had 64 FSEL behind a branch on the length: ptxas then
# waited for P V before the row maximum, where the dense kernel overlaps them); and the last
# block's ragged store no longer shifts P's registers: with the row written q_start + bx *
# block_M + i, ptxas moved 29-31 of them before each P V wgmma (the forward without the LSE, fp16
# and bf16); now at most 3 moves a loop, as with the LSE (459-460 instructions, dense 475)
@pytest.mark.parametrize("dtype,store_lse", [("float16", False), ("bfloat16", False),
                                             ("bfloat16", True)])
def test_the_non_causal_varlen_consumer_loop_has_no_mask(dtype, store_lse):
    import tilews.language as T
    prog = mha_fwd_varlen_program(16, 16, 128, False, block_M=128, block_N=128, num_stages=2,
                                  threads=256, dtype=getattr(T, dtype), store_lse=store_lse)
    kv_loops = [body for body in innermost_loops(_sass(prog))
                if sum(op.startswith("HGMMA") for op in body) == 16]
    assert len(kv_loops) >= 2, [len(b) for b in kv_loops]          # one per consumer warp group
    for body in kv_loops:
        assert not any(op.startswith("FSEL") for op in body), sorted(set(body))
        assert sum(op.startswith("IMAD.MOV") for op in body) <= 3, len(body)
