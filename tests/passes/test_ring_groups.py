"""warp_specialize's rings per group of copies (K and V on rings of their own when the consumer
first reads them at different statements) where the loop body is guarded: block-sparse attention,
whose K/V blocks run only where a block mask says so (docs/ws-semantics.md #8: phases advance
only on iterations that run). A GEMM, whose copies are first read by one gemm, keeps one pair."""
from __future__ import annotations

import math
import re

import pytest
import torch

import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import walk

from ..helpers import gluon_program, randn
from ..test_ws_oracle import assert_same_under_schedules, run_interp

B, H, S, D, BM, BN = 1, 2, 256, 64, 128, 64


def sparse_attention():
    """Non-causal attention over the K/V blocks ``BlockMask[b, h, q_block, k_block]`` keeps."""
    scale = 1.0 / math.sqrt(D)
    shape, nq, nk = [B, H, S, D], S // BM, S // BN

    @T.prim_func
    def main(Q: T.Tensor(shape, T.float16), K: T.Tensor(shape, T.float16), V: T.Tensor(shape, T.float16),
             BlockMask: T.Tensor([B, H, nq, nk], T.int32), Out: T.Tensor(shape, T.float16)):
        with T.Kernel(nq, H, B, threads=256) as (bx, by, bz):
            Q_s = T.alloc_shared([BM, D], T.float16)
            K_s = T.alloc_shared([BN, D], T.float16)
            V_s = T.alloc_shared([BN, D], T.float16)
            s = T.alloc_fragment([BM, BN], T.float32)
            p = T.alloc_fragment([BM, BN], T.float16)
            o = T.alloc_fragment([BM, D], T.float32)
            m = T.alloc_fragment([BM], T.float32)
            m_prev = T.alloc_fragment([BM], T.float32)
            alpha = T.alloc_fragment([BM], T.float32)
            row_sum = T.alloc_fragment([BM], T.float32)
            l = T.alloc_fragment([BM], T.float32)  # noqa: E741
            T.copy(Q[bz, by, bx * BM, 0], Q_s)
            T.fill(o, 0)
            T.fill(l, 0)
            T.fill(m, -1e30)
            for k in T.Pipelined(nk, num_stages=2):
                if BlockMask[bz, by, bx, k] != 0:
                    T.copy(K[bz, by, k * BN, 0], K_s)
                    T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True)
                    T.copy(V[bz, by, k * BN, 0], V_s)
                    T.copy(m, m_prev)
                    T.reduce_max(s, m, dim=1, clear=False)
                    for i in T.Parallel(BM):
                        alpha[i] = T.exp((m_prev[i] - m[i]) * scale)
                    for i, j in T.Parallel(BM, BN):
                        s[i, j] = T.exp((s[i, j] - m[i]) * scale)
                    T.reduce_sum(s, row_sum, dim=1)
                    for i in T.Parallel(BM):
                        l[i] = l[i] * alpha[i] + row_sum[i]
                    T.copy(s, p)
                    for i, j in T.Parallel(BM, D):
                        o[i, j] *= alpha[i]
                    T.gemm(p, V_s, o)
            for i, j in T.Parallel(BM, D):
                o[i, j] /= l[i]
            T.copy(o, Out[bz, by, bx * BM, 0])
    return main


def inputs(seed):
    q, k, v = (randn(B, H, S, D, dtype=torch.float16, seed=seed + i) for i in range(3))
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, H, S // BM, S // BN, generator=g) < 0.6).to(torch.int32)
    mask[..., 0] = 1                                # every query block sees at least one block
    return [q, k, v, mask, torch.empty(B, H, S, D, dtype=torch.float16)]


def reference(q, k, v, mask):
    keep = mask.repeat_interleave(BM, dim=2).repeat_interleave(BN, dim=3).bool()
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v.double()


def test_guarded_loop_gets_a_ring_per_copy_and_waits_inside_the_guard():
    k = lower(build_kernel(sparse_attention()), HOPPER)
    bars = {s.buffer.name for s in walk(k.body) if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER}
    assert {"full_K_s", "empty_K_s", "full_V_s", "empty_V_s"} <= bars and "full" not in bars
    ws = next(s for s in k.body.stmts if isinstance(s, ir.WarpSpecialize))
    for role in ws.roles:
        loop = next(s for s in role.body.stmts if isinstance(s, ir.For))
        guard = loop.body.stmts[0]
        assert isinstance(guard, ir.If) and len(loop.body.stmts) == 1
        names = [t.barrier.buffer.name for t in walk(guard.then) if isinstance(t, (ir.BarrierWait, ir.BarrierArrive))]
        assert sorted(set(names)) == ["empty_K_s", "empty_V_s", "full_K_s", "full_V_s"]
        # the ring slot is the count of iterations that ran, bumped last inside the guard
        bump = guard.then.stmts[-1]
        assert isinstance(bump, ir.Store) and bump.buffer.scope is ir.Scope.LOCAL


@pytest.mark.parametrize("seed", range(3))
def test_guarded_attention_means_the_program(seed):
    args = inputs(seed)
    got = run_interp(build_kernel(sparse_attention()), args, 4)
    exact = reference(*args[:4])
    assert ((got.double() - exact).norm() / exact.norm()).item() < 1e-2
    assert_same_under_schedules(sparse_attention(), args, 4, seeds=range(6))


def test_gemm_keeps_one_pair():
    from examples.gemm import matmul
    k = lower(build_kernel(matmul.fn(256, 256, 128, block_M=128, block_N=128, block_K=64,
                                     num_stages=2, threads=256)), HOPPER)
    bars = {s.buffer.name for s in walk(k.body) if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.BARRIER}
    assert bars == {"full", "empty"}


def test_guarded_attention_compiles_for_sm90a():
    """Each consumer role counts the iterations it ran in a register of its own."""
    p = gluon_program(lower(build_kernel(sparse_attention()), HOPPER))
    assert "consumed_0" in p.source and "consumed_1" in p.source
    assert len(re.findall(r"mbarrier\.init\.shared::cta\.b64", p.asm["ptx"])) == 1 + 4 * 2
    assert "wgmma.mma_async" in p.asm["ptx"]
