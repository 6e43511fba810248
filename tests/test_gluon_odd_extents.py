"""Hopper compile-only: tiles whose extents are not powers of two stay on the warp-specialized
Gluon path (split_extents cuts them into power-of-two pieces).

Attention at head dims 96 and 192 (causal and not) and GEMMs with block_N 192 and block_K 96
(the programs of tests/passes/test_split_extents.py) compile for ``GPUTarget("cuda", 90, 32)``
without a GPU: the jit report says the gluon backend took them; the TTGIR has one
``ttg.warp_specialize``, a ``ttng.warp_group_dot`` per piece with the pieces' shapes and TMA
copies for each piece; the PTX has wgmma instructions of the pieces' N. The attention backward's
main kernel at D96 and D192 adds dQ's tile by one bulk reduce-add per piece.
"""
from __future__ import annotations

import collections
import functools
import re

import pytest

import tilews
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, AsyncRefusal
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import gluon_program
from .passes.test_split_extents import attention, gemm


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


@functools.lru_cache(maxsize=None)
def compiled(name: str):
    kind, *args = name.split("-")
    if kind == "gemm":
        bn, bk = map(int, args)
        prim = gemm(512, 2 * bn, 4 * bk, block_N=bn, block_K=bk)
    else:
        dim, causal = int(args[0]), args[1] == "causal"
        prim = attention(1, 2, 512, dim, causal)
    kernel = lower(build_kernel(prim), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None, kernel.plans
    return kernel, gluon_program(kernel)


def warp_group_dots(ttgir: str) -> list[tuple[str, str, str]]:
    """(A, B, C) types of each warp_group_dot: 'MxK' (tensor or memdesc), 'KxN', 'MxN'."""
    out = []
    for line in re.findall(r"ttng\.warp_group_dot %[^\n]*", ttgir):
        a, b, c = re.search(r": (?:tensor|!ttg\.memdesc)<(\d+x\d+)x\w+[^*]*\* !ttg\.memdesc<(\d+x\d+)x\w+"
                            r"[^>]*> -> tensor<(\d+x\d+)xf32", line).groups()
        out.append((a, b, c))
    return out


@pytest.mark.parametrize("bn,bk", [(192, 64), (128, 96)])
def test_gemm_pieces(bn, bk):
    p = compiled(f"gemm-{bn}-{bk}")[1]
    ttgir, ptx = p.asm["ttgir"], p.asm["ptx"]
    assert count(r"ttg\.warp_specialize\(", ttgir) == 1
    n_pieces = [128, 64] if bn == 192 else [bn]
    k_pieces = [64, 32] if bk == 96 else [bk]
    # one warp_group_dot per (N piece, K piece); B's K x N; C's 128 x N
    want = sorted((f"128x{k}", f"{k}x{n}", f"128x{n}") for n in n_pieces for k in k_pieces)
    assert sorted(warp_group_dots(ttgir)) == want
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.", ptx))
    # one warp group: 2 row blocks of 64, (K piece) / 16 steps each
    want_shapes = collections.Counter()
    for n in n_pieces:
        for k in k_pieces:
            want_shapes[f"m64n{n}k16"] += 2 * k // 16
    assert shapes == want_shapes
    # TMA: a load per piece of each operand in the producer's loop, a store per piece of C
    loads = len(k_pieces) + len(k_pieces) * len(n_pieces)
    assert count(r"ttng\.async_tma_copy_global_to_local", ttgir) == loads
    assert count(r"ttng\.async_tma_copy_local_to_global", ttgir) == len(n_pieces)
    # the pieces share one ring barrier pair; the gemms of an iteration stay in flight together
    assert count(r"mbarrier\.init\.shared::cta\.b64", ptx) == 2 * 3
    assert re.search(rf"wgmma\.wait_group\.sync\.aligned\s+{len(n_pieces) * len(k_pieces)};", ptx)
    assert count(r"\b(ld|st)\.local\b", ptx) == 0, "the kernel spills registers"


@pytest.mark.parametrize("causal", ["full", "causal"])
@pytest.mark.parametrize("dim", [96, 192])
def test_attention_pieces(dim, causal):
    kernel, p = compiled(f"attention-{dim}-{causal}")
    ttgir, ptx, src = p.asm["ttgir"], p.asm["ptx"], p.source
    hi, lo = (128, 64) if dim == 192 else (64, 32)
    assert "from triton.experimental import gluon" in src
    assert count(r"ttg\.warp_specialize\(", ttgir) == 1
    # per consumer role (64 query rows): S = Q K^T over K hi + lo, the output's pieces += P V
    # over N hi and lo; one warp_group_dot per gemm of the lowered IR (overlap_softmax peels the
    # first Q K^T and the last P V out of the loop)
    gemms = [s for s in walk(kernel.body) if isinstance(s, ir.Gemm)]
    want = collections.Counter()
    for g in gemms:
        (M, N), K = g.c.tile_shape, g.a.tile_shape[-1]
        want[(f"{M}x{K}", f"{K}x{N}", f"{M}x{N}")] += 1
    assert collections.Counter(warp_group_dots(ttgir)) == want
    assert set(want) == {(f"64x{hi}", f"{hi}x64", "64x64"), (f"64x{lo}", f"{lo}x64", "64x64"),
                         ("64x64", f"64x{hi}", f"64x{hi}"), ("64x64", f"64x{lo}", f"64x{lo}")}
    assert len(gemms) == 2 * 2 * 4      # two roles, each its 4 gemms in and out of the loop
    # the deferred P V: Q K^T of block k completes while both P V pieces of block k - 1 run
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+2;", ptx)
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.", ptx))
    assert shapes == {"m64n64k16", f"m64n{hi}k16", f"m64n{lo}k16"}
    # TMA: Q, K and V in two pieces each; the output's two pieces stored per consumer
    assert count(r"ttng\.async_tma_copy_global_to_local", ttgir) == 6
    assert count(r"ttng\.async_tma_copy_local_to_global", ttgir) == 2 * 2
    # one barrier for Q, one full/empty pair per ring (K's pieces share one, V's one), 2 stages
    assert count(r"mbarrier\.init\.shared::cta\.b64", ptx) == 1 + 2 * 2 * 2
    assert count(r"\b(ld|st)\.local\b", ptx) == 0, "the kernel spills registers"


def test_jit_report_says_gluon_took_head_dim_192():
    k = tilews.jit(out_idx=[3], target="hopper")(attention)(1, 2, 256, 192, True)
    assert k.target == "hopper" and k.report.backend == "gluon", (k.target, k.report.notes)
    assert any(n.startswith("split_extents: cut into power-of-two pieces") for n in k.report.notes)


def test_backward_style_programs_are_not_required_on_gluon():
    # a gemm whose M is the head dim (dK = dS^T Q in a backward pass) keeps its tiles whole, and
    # legalize_wgmma's refusal (the tl backend then compiles it) says why
    kernel = lower(build_kernel(gemm(384, 256, 128, block_M=192, block_N=128)), HOPPER)
    assert any(n.startswith("split_extents: kept whole, dim 0 of") for n in kernel.notes)
    assert kernel.find_plan(AsyncRefusal).reason.endswith(
        "and split_extents kept it whole: dim 0 of 'A_s' (192) is a gemm's M dim: rows are not "
        "cut (split_consumers divides them among warp groups)")
    assert not any(isinstance(s, ir.Alloc) and s.buffer.name.endswith("_128") for s in walk(kernel.body))


# ----------------------------------------------------------------------------------------------
# a training forward that also stores each row's log-sum-exp (TileLang's gqa_bwd flash_fwd, D 192)


def forward_with_lse(batch, heads, seq_len, dim, block_M=128, block_N=64, threads=256):
    import tilews.language as T
    scale = 1.44269504 / dim ** 0.5
    shape = [batch, seq_len, heads, dim]

    @T.prim_func
    def main(Q: T.Tensor(shape, T.float16), K: T.Tensor(shape, T.float16),
             V: T.Tensor(shape, T.float16), Out: T.Tensor(shape, T.float16),
             Lse: T.Tensor([batch, heads, seq_len], T.float32)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared([block_M, dim], T.float16)
            K_s = T.alloc_shared([block_N, dim], T.float16)
            V_s = T.alloc_shared([block_N, dim], T.float16)
            s = T.alloc_fragment([block_M, block_N], T.float32)
            p = T.alloc_fragment([block_M, block_N], T.float16)
            o = T.alloc_fragment([block_M, dim], T.float32)
            m = T.alloc_fragment([block_M], T.float32)
            m_prev = T.alloc_fragment([block_M], T.float32)
            rescale = T.alloc_fragment([block_M], T.float32)
            row_sum = T.alloc_fragment([block_M], T.float32)
            lse = T.alloc_fragment([block_M], T.float32)
            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s)
            T.fill(o, 0)
            T.fill(lse, 0)
            T.fill(m, -T.infinity(T.float32))
            for k in T.Pipelined(T.ceildiv(seq_len, block_N), num_stages=2):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s)
                T.clear(s)
                T.gemm(Q_s, K_s, s, transpose_B=True)
                T.copy(m, m_prev)
                T.reduce_max(s, m, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    rescale[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    s[i, j] = T.exp2(s[i, j] * scale - m[i] * scale)
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_M):
                    lse[i] = lse[i] * rescale[i] + row_sum[i]
                T.copy(s, p)
                for i, j in T.Parallel(block_M, dim):
                    o[i, j] *= rescale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_s)
                T.gemm(p, V_s, o)
            for i, j in T.Parallel(block_M, dim):
                o[i, j] /= lse[i]
            for i in T.Parallel(block_M):
                lse[i] = T.log2(lse[i]) + m[i] * scale
            T.copy(o, Out[bz, bx * block_M:(bx + 1) * block_M, by, :])
            T.copy(lse, Lse[bz, by, bx * block_M:(bx + 1) * block_M])
    return main


@pytest.mark.parametrize("dim", [128, 192])
def test_forward_storing_lse_splits_its_consumers(dim):
    """Each of the two split consumer roles stores its 64 rows of the log-sum-exp vector through
    its half of the staging vector (a 1-d row-split buffer: its rows are dim 0), and the lowered
    program computes what torch does, on the interpreter; it compiles for sm_90."""
    import torch

    from tilews.lowering import interpreter

    from .helpers import poisoned, randn, rel_err
    B, H, S = 1, 2, 256
    prim = forward_with_lse(B, H, S, dim)
    lowered = lower(build_kernel(prim), HOPPER)
    assert lowered.find_plan(AsyncPlan) is not None, lowered.notes
    roles = [r for s in walk(lowered.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles]
    assert len(roles) == 3, lowered.notes            # producer + 2 split consumers
    q, k, v = (randn(B, S, H, dim, dtype=torch.float16, seed=s) for s in (7, 8, 9))
    out, lse = poisoned(B, S, H, dim, dtype=torch.float16), poisoned(B, H, S)
    interpreter.run(lowered, [q, k, v, out, lse])
    logits = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / dim ** 0.5
    want_o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, -1), v.double())
    assert rel_err(out, want_o) < 5e-3
    assert rel_err(lse, torch.logsumexp(logits, -1) * 1.44269504) < 1e-4
    assert "warp_group_dot" in gluon_program(lowered).asm["ttgir"]


# ----------------------------------------------------------------------------------------------
# the attention backward's dQ, added by tile at head dims 96 and 192


@pytest.mark.parametrize("dim", [96, 192])
def test_backward_adds_dq_by_one_bulk_reduce_per_piece(dim):
    """Compile-only (sm_90a) through the compile path, the op's main kernel at B8 H16 S4096
    (its split tail on 132 SMs): with ``dq_tile_add`` (``blocks``' choice) split_extents cuts
    dQ's shared tile like the head dim, and the kernel stays warp-specialized on Gluon with one
    bulk reduce-add per piece into its columns of dQ (no element atomic of dQ), no spills, and
    Triton's shared memory within an H100's (D192 lowered again for Triton's scratch)."""
    import tilews.language as T
    from tilews.lowering.capabilities import SM90
    from tilews.ops.attention_backward import blocks, kernels, op_tail_split
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import innermost_loops

    cfg = blocks(dim, True)
    assert cfg["dq_tile_add"] and not cfg["tail_tile_add"]
    units, parts = op_tail_split(8, 16, 16, 4096, dim, False, cfg, 132)
    main = kernels("hopper")[1](8, 16, 16, 4096, dim, False, 4096, dtype=T.float16,
                                **dict(cfg, tail_units=units, tail_parts=parts)).kernels[0]
    hi, lo = (128, 64) if dim == 192 else (64, 32)
    assert main.report.backend == "gluon", main.report.notes
    assert any(f"dq_s ({hi} + {lo})" in n for n in main.report.notes), main.report.notes
    src = main.program.source
    assert count(r"gl\.warp_specialize\(", src) == 1
    assert re.findall(r"async_reduce_add\(dQ_desc_\d, \[[^\]]*, (\d+)\], dq_s_(\d+)\)", src) == \
        [("0", "0"), (str(hi), str(hi))]
    assert not re.search(r"gl\.atomic_add\(dQ\b", src)
    assert main.program.metadata["shared"] <= SM90.smem_bytes
    ptx = main.program.asm["ptx"]
    assert count(r"cp\.reduce\.async\.bulk\.tensor\.4d\.global\.shared::cta\.add", ptx) == 2
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    assert "0 bytes spill stores" in report, report
    loop = max(innermost_loops(sass(ptx)), key=len)
    assert not [op for op in loop if op.startswith(("STL", "LDL"))]
