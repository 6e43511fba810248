"""GQA decoding over ragged key/value lengths on the warp-specialized Gluon path (issue 38).

The program is written the way TileLang's varlen decode examples are: each block computes a
``block_H``-row query tile of which only ``valid`` rows are real heads, its K/V blocks come from a
``cu_seqlens``-bounded range (a ``T.Pipelined`` loop whose trip count is read from global
memory), each block's row maxima go to a shared column ``block_max[:, t]``, a sink vector is read
from shared memory inside ``T.Parallel``, and the result leaves through ``acc[:valid, :]``.
On ``hopper`` it must stay warp-specialized (registerize keeps the scratch buffers in registers);
the lowered program runs on the interpreter against a float64 reference, and the same program
runs on ``interpret`` and ``triton`` (Triton's CPU interpreter), outputs poisoned.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import poisoned, randn, unwaited_global_accesses

LOG2E = 1.44269504


def varlen_decode(batch, heads, kv_heads, max_len, total, dim, block_N=64, block_H=64):
    group = heads // kv_heads
    valid = min(block_H, group)
    n_blocks = math.ceil(max_len / block_N)
    scale = dim ** -0.5 * LOG2E
    f16, f32 = T.float16, T.float32

    @T.prim_func
    def main(Q: T.Tensor((batch, heads, dim), f16), K: T.Tensor((total, kv_heads, dim), f16),
             V: T.Tensor((total, kv_heads, dim), f16), cu: T.Tensor((batch + 1,), T.int32),
             sink: T.Tensor((heads,), f32), O: T.Tensor((batch, heads, dim), f16),
             M: T.Tensor((batch, heads, n_blocks), f32)):
        with T.Kernel(batch, heads // valid, threads=128) as (b, g):
            q_s = T.alloc_shared((block_H, dim), f16)
            k_s = T.alloc_shared((block_N, dim), f16)
            v_s = T.alloc_shared((block_N, dim), f16)
            o_s = T.alloc_shared((valid, dim), f16)
            sink_s = T.alloc_shared((block_H,), f32)
            block_max = T.alloc_shared((block_H, n_blocks), f32)
            s = T.alloc_fragment((block_H, block_N), f32)
            p = T.alloc_fragment((block_H, block_N), f16)
            acc = T.alloc_fragment((block_H, dim), f32)
            row_max = T.alloc_fragment((block_H,), f32)
            prev = T.alloc_fragment((block_H,), f32)
            rescale = T.alloc_fragment((block_H,), f32)
            row_sum = T.alloc_fragment((block_H,), f32)
            denom = T.alloc_fragment((block_H,), f32)
            start = cu[b]
            length = cu[b + 1] - start
            T.copy(Q[b, g * valid:g * valid + block_H, :], q_s)
            T.fill(acc, 0)
            T.fill(denom, 0)
            T.fill(block_max, 0)        # blocks past this sequence's length stay 0
            T.fill(row_max, -T.infinity(f32))
            for t in T.Pipelined(T.ceildiv(length, block_N), num_stages=1):
                T.copy(K[start + t * block_N:start + (t + 1) * block_N, g * valid // group, :], k_s)
                T.clear(s)
                T.gemm(q_s, k_s, s, transpose_B=True)
                for i, j in T.Parallel(block_H, block_N):
                    s[i, j] = T.if_then_else(t * block_N + j < length, s[i, j], -T.infinity(f32))
                T.copy(row_max, prev)
                T.reduce_max(s, row_max, dim=1, clear=False)
                T.copy(row_max, block_max[:, t])
                for i in T.Parallel(block_H):
                    rescale[i] = T.exp2(prev[i] * scale - row_max[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    s[i, j] = T.exp2(s[i, j] * scale - row_max[i] * scale)
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_H):
                    denom[i] = denom[i] * rescale[i] + row_sum[i]
                T.copy(s, p)
                for i, j in T.Parallel(block_H, dim):
                    acc[i, j] *= rescale[i]
                T.copy(V[start + t * block_N:start + (t + 1) * block_N, g * valid // group, :], v_s)
                T.gemm(p, v_s, acc)
            T.copy(sink[g * valid:g * valid + block_H], sink_s)
            for i in T.Parallel(block_H):
                denom[i] += T.exp2(sink_s[i] * LOG2E - row_max[i] * scale)
            for i, j in T.Parallel(block_H, dim):
                acc[i, j] /= denom[i]
            for i, t in T.Parallel(block_H, n_blocks):
                block_max[i, t] = T.exp2((block_max[i, t] - row_max[i]) * scale) / denom[i]
            T.copy(acc[:valid, :], o_s)
            T.copy(o_s, O[b, g * valid:(g + 1) * valid, :])
            T.copy(block_max[:valid, :], M[b, g * valid:(g + 1) * valid, :])

    return main


def inputs(lengths, heads, kv_heads, dim):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    total = int(cu[-1])
    q = randn(len(lengths), heads, dim, dtype=torch.float16, seed=1)
    k = randn(total, kv_heads, dim, dtype=torch.float16, seed=2)
    v = randn(total, kv_heads, dim, dtype=torch.float16, seed=3)
    sink = randn(heads, seed=4) * 0.5
    return q, k, v, cu, sink


def reference(q, k, v, cu, sink, block_N):
    """Output and, per k-block, the largest attention weight up to and including it (the
    program records the running row maximum), in float64."""
    heads, rep = q.shape[1], q.shape[1] // k.shape[1]
    outs, maxima = [], []
    for b in range(q.shape[0]):
        kb = k[cu[b]:cu[b + 1]].double().repeat_interleave(rep, 1)
        vb = v[cu[b]:cu[b + 1]].double().repeat_interleave(rep, 1)
        logits = torch.einsum("hd,shd->hs", q[b].double(), kb) / math.sqrt(q.shape[-1])
        m = logits.max(-1, keepdim=True).values
        e = torch.exp(logits - m)
        w = e / (e.sum(-1, keepdim=True) + torch.exp(sink.double()[:, None] - m))
        outs.append(torch.einsum("hs,shd->hd", w, vb))
        n = math.ceil(w.shape[1] / block_N)
        per_block = torch.stack([w[:, j * block_N:(j + 1) * block_N].max(-1).values
                                 for j in range(n)], 1)
        maxima.append(per_block.cummax(1).values)
    return torch.stack(outs), maxima


LENGTHS = [70, 256, 129]           # ragged: a partial last block, a full range, one row past
HEADS, KV_HEADS, DIM, MAX_LEN, BLOCK_N = 8, 2, 64, 256, 64


def check(o, m, args):
    want_o, want_m = reference(*args, BLOCK_N)
    assert torch.allclose(o.double(), want_o, atol=2e-2, rtol=2e-2), (o.double() - want_o).abs().max()
    for b, wm in enumerate(want_m):
        got = m[b, :, :wm.shape[1]].double()
        assert torch.allclose(got, wm, atol=2e-3, rtol=2e-2), (got - wm).abs().max()


def program(lengths=LENGTHS):
    return varlen_decode(len(lengths), HEADS, KV_HEADS, MAX_LEN, sum(lengths), DIM, BLOCK_N)


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_varlen_decode_numerics(target):
    args = inputs(LENGTHS, HEADS, KV_HEADS, DIM)
    o = poisoned(len(LENGTHS), HEADS, DIM, dtype=torch.float16)
    m = poisoned(len(LENGTHS), HEADS, MAX_LEN // BLOCK_N)
    kernel = tilews.jit(out_idx=None, target=target)(program())
    kernel(*args, o, m)
    check(o, m, args)


@pytest.mark.parametrize("seed", range(4))
def test_lowered_hopper_program_matches_reference(seed):
    """The program after the Gluon pipeline (roles, rings, registerized scratch) on the
    interpreter, under several schedules of its roles."""
    lowered = lower(build_kernel(program()), HOPPER)
    assert lowered.find_plan(AsyncPlan) is not None, lowered.notes
    assert any(n.startswith("registerize: ") for n in lowered.notes)
    args = inputs(LENGTHS, HEADS, KV_HEADS, DIM)
    o = poisoned(len(LENGTHS), HEADS, DIM, dtype=torch.float16)
    m = poisoned(len(LENGTHS), HEADS, MAX_LEN // BLOCK_N)
    interpreter.run(lowered, [*args, o, m], seed=seed)
    check(o, m, args)


@pytest.mark.parametrize("sizes, block_N, dim", [
    ((3, HEADS, KV_HEADS, MAX_LEN), BLOCK_N, DIM),
    ((64, 32, 8, 8192), 128, 128),               # the GQA decode benchmark's shapes
])
def test_hopper_stays_warp_specialized(sizes, block_N, dim):
    batch, heads, kv_heads, max_len = sizes
    kernel = tilews.jit(out_idx=None, target="hopper")(
        varlen_decode(batch, heads, kv_heads, max_len, batch * max_len, dim, block_N))
    assert kernel.report.backend == "gluon", kernel.report.notes
    ptx = kernel.program.asm["ptx"]
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    assert shapes == {f"m64n{block_N}k16", f"m64n{dim}k16"}
    assert "cp.async.bulk.tensor" in ptx                 # Q, K and V through TMA
    assert unwaited_global_accesses(ptx) == []           # ... after the previous grid's end
    assert not re.search(r"\b(ld|st)\.local\b", ptx), "the kernel spills registers"


def test_tiles_of_unknown_work_stay_one_block_each():
    """More tiles than SMs, but each tile's trip count is read from ``cu``: ``persist`` keeps the
    grid (the GPU hands each block to the next free SM) and says why; the program still means
    the same on the interpreter."""
    lowered = lower(build_kernel(program()), HOPPER.replace(num_sms=2))
    note = next(n for n in lowered.notes if n.startswith("persist:"))
    assert "iterations read from memory" in note and "one block per tile" in note, note
    assert len(lowered.grid) == 2
    assert not any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT for s in walk(lowered.body))
    assert lowered.find_plan(AsyncPlan) is not None, lowered.notes
    args = inputs(LENGTHS, HEADS, KV_HEADS, DIM)
    o = poisoned(len(LENGTHS), HEADS, DIM, dtype=torch.float16)
    m = poisoned(len(LENGTHS), HEADS, MAX_LEN // BLOCK_N)
    interpreter.run(lowered, [*args, o, m], seed=1)
    check(o, m, args)
