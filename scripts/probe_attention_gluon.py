"""Hand-written Gluon attention forward probes: which consumer schedule reaches cuDNN on Hopper?

Written outside the compiler (as docs/measuring.md's earlier probes were) to decide what the
Hopper passes should produce. One kernel, schedule switches as constexprs:

* ``split_kv``: K and V on separate full/empty rings, so Q K^T waits only for K and a K stage is
  released when Q K^T is done, a V stage when P V is done;
* ``fa3``: FlashAttention-3's intra-warp-group overlap: in iteration k, Q K_k^T and P_{k-1} V_{k-1}
  are issued together, the softmax of block k runs while P V is in flight (needs ``split_kv``);
* ``pingpong``: the two consumer warp groups take turns issuing their gemms (mbarriers), so one's
  softmax runs under the other's gemms;
* ``stages``: ring depth (3 fits at D=128 because the output tile reuses Q's shared memory);
* ``bn``: K/V block rows (256 tried at D=64).

Measured on an H100 (docs/measuring.md): the deferred P V with split rings gains 5-10% over
the schedule without it; explicit ping-pong, 3 stages and 256-row K/V blocks do not help.

    python scripts/probe_attention_gluon.py [--rounds N] [--compile-only]
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from gluon_probes import probe_module

LOG2E = 1.4426950408889634


KERNEL = '''
@gluon.jit
def _softmax(s, m_i, l_i, qk_scale):
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2((m_i - m_new) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new * qk_scale, 1))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, alpha, l_i


@gluon.jit
def _scores_init(k, row0, seq_len, s_layout: gl.constexpr):
    """0 where key k*BN + j may be attended by row row0 + i, -inf elsewhere."""
    i = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout)), 1)
    j = gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout)), 0)
    ok = (k * BN + j) < seq_len
    if CAUSAL:
        ok = ok & (row0 + i >= k * BN + j)
    return gl.full([64, BN], 0, gl.float32, layout=s_layout) + gl.where(ok, 0.0, -float("inf"))


@gluon.jit
def _qk(q, K_smem, k, row0, row_lo, seq_len, fullK, s_layout: gl.constexpr):
    """Issue S = Q K_k^T (asynchronously) after waiting for K_k."""
    st = k % STAGES
    mbarrier.wait(fullK.index(st), (k // STAGES) & 1)
    if CAUSAL:
        unmasked = (k + 1) * BN <= gl.minimum(seq_len, row_lo + 1)
    else:
        unmasked = (k + 1) * BN <= seq_len
    if unmasked:
        init = gl.zeros([64, BN], gl.float32, layout=s_layout)
    else:
        init = _scores_init(k, row0, seq_len, s_layout)
    # one wgmma after the branch: an in-flight result must not leave an scf.if
    s = warpgroup_mma(q, K_smem.index(st).permute((1, 0)), init, is_async=True)
    return s


@gluon.jit
def _block(seq_len):
    """This block's query tile (causal: the longest rows first), head, batch, and K/V blocks."""
    bm = gl.program_id(0)
    if CAUSAL:
        bx = gl.cdiv(seq_len, 128) - 1 - bm
        n = gl.minimum(gl.cdiv(seq_len, BN), gl.cdiv((bx + 1) * 128, BN))
    else:
        bx = bm
        n = gl.cdiv(seq_len, BN)
    return bx, gl.program_id(1), gl.program_id(2), n


@gluon.jit
def _consumer(Q_smem, K_smem, V_smem, out_desc, preloaded, fullK, emptyK, fullV, emptyV, turn,
              seq_len, qk_scale, WG: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    bx, by, bz, n = _block(seq_len)
    row0 = bx * 128 + WG * 64
    row_lo = bx * 128
    q = Q_smem.slice(WG * 64, 64)
    m_i = gl.full([64], -float("inf"), gl.float32, layout=row_layout)
    l_i = gl.full([64], 0.0, gl.float32, layout=row_layout)
    acc = gl.zeros([64, D], gl.float32, layout=o_layout)
    mbarrier.wait(preloaded.index(0), 0)
    turns = 0
    if FA3:
        if PINGPONG:
            mbarrier.wait(turn.index(WG), (turns & 1) ^ (1 - WG))
        s = _qk(q, K_smem, 0, row0, row_lo, seq_len, fullK, s_layout)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG), count=1)
            turns += 1
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(emptyK.index(0), count=1)
        p, m_i, alpha, l_i = _softmax(s, m_i, l_i, qk_scale)
        p16 = gl.convert_layout(p.to(gl.float16), p_layout)
        for k in range(1, n):
            if PINGPONG:
                mbarrier.wait(turn.index(WG), (turns & 1) ^ (1 - WG))
            s = _qk(q, K_smem, k, row0, row_lo, seq_len, fullK, s_layout)
            sv = (k - 1) % STAGES
            mbarrier.wait(fullV.index(sv), ((k - 1) // STAGES) & 1)
            acc = warpgroup_mma(p16, V_smem.index(sv), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - WG), count=1)
                turns += 1
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            mbarrier.arrive(emptyK.index(k % STAGES), count=1)
            p, m_i, alpha, l_i = _softmax(s, m_i, l_i, qk_scale)
            acc, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p16))
            mbarrier.arrive(emptyV.index(sv), count=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
            p16 = gl.convert_layout(p.to(gl.float16), p_layout)
        if PINGPONG:
            mbarrier.wait(turn.index(WG), (turns & 1) ^ (1 - WG))
        sv = (n - 1) % STAGES
        mbarrier.wait(fullV.index(sv), ((n - 1) // STAGES) & 1)
        acc = warpgroup_mma(p16, V_smem.index(sv), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG), count=1)
        acc, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p16))
        mbarrier.arrive(emptyV.index(sv), count=1)
    else:
        for k in range(0, n):
            if PINGPONG:
                mbarrier.wait(turn.index(WG), (turns & 1) ^ (1 - WG))
            s = _qk(q, K_smem, k, row0, row_lo, seq_len, fullK, s_layout)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - WG), count=1)
                turns += 1
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            if SPLIT_KV:
                mbarrier.arrive(emptyK.index(k % STAGES), count=1)
            p, m_i, alpha, l_i = _softmax(s, m_i, l_i, qk_scale)
            p16 = gl.convert_layout(p.to(gl.float16), p_layout)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
            sv = k % STAGES
            if SPLIT_KV:
                mbarrier.wait(fullV.index(sv), (k // STAGES) & 1)
            acc = warpgroup_mma(p16, V_smem.index(sv), acc, is_async=True)
            acc, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p16))
            if SPLIT_KV:
                mbarrier.arrive(emptyV.index(sv), count=1)
            else:
                mbarrier.arrive(emptyK.index(sv), count=1)
    acc = acc / gl.expand_dims(gl.convert_layout(l_i, orow_layout), 1)
    o_smem = Q_smem.slice(WG * 64, 64)     # Q is dead: the output tile reuses its rows
    o_smem.store(acc.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(out_desc, [bz, by, row0, 0], o_smem)
    tma.store_wait(0)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, Q_smem, K_smem, V_smem, preloaded, fullK, emptyK, fullV,
              emptyV, seq_len):
    bx, by, bz, n = _block(seq_len)
    mbarrier.expect(preloaded.index(0), q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bz, by, bx * 128, 0], preloaded.index(0), Q_smem)
    for k in range(0, n):
        st = k % STAGES
        ph = ((k // STAGES) & 1) ^ 1
        if SPLIT_KV:
            mbarrier.wait(emptyK.index(st), ph)
            mbarrier.expect(fullK.index(st), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [bz, by, k * BN, 0], fullK.index(st), K_smem.index(st))
            mbarrier.wait(emptyV.index(st), ph)
            mbarrier.expect(fullV.index(st), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [bz, by, k * BN, 0], fullV.index(st), V_smem.index(st))
        else:
            mbarrier.wait(emptyK.index(st), ph)
            mbarrier.expect(fullK.index(st), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [bz, by, k * BN, 0], fullK.index(st), K_smem.index(st))
            tma.async_copy_global_to_shared(v_desc, [bz, by, k * BN, 0], fullK.index(st), V_smem.index(st))


@gluon.jit
def _wg0(q_desc, k_desc, v_desc, out_desc, Q_smem, K_smem, V_smem, preloaded, fullK, emptyK, fullV,
         emptyV, turn, seq_len, qk_scale):
    _consumer(Q_smem, K_smem, V_smem, out_desc, preloaded, fullK, emptyK, fullV, emptyV, turn,
              seq_len, qk_scale, 0)


@gluon.jit
def _wg1(q_desc, k_desc, v_desc, out_desc, Q_smem, K_smem, V_smem, preloaded, fullK, emptyK, fullV,
         emptyV, turn, seq_len, qk_scale):
    _consumer(Q_smem, K_smem, V_smem, out_desc, preloaded, fullK, emptyK, fullV, emptyV, turn,
              seq_len, qk_scale, 1)


@gluon.jit
def _load(q_desc, k_desc, v_desc, out_desc, Q_smem, K_smem, V_smem, preloaded, fullK, emptyK, fullV,
          emptyV, turn, seq_len, qk_scale):
    _producer(q_desc, k_desc, v_desc, Q_smem, K_smem, V_smem, preloaded, fullK, emptyK, fullV,
              emptyV, seq_len)


@gluon.jit
def attention_probe(q_desc, k_desc, v_desc, out_desc, seq_len, qk_scale):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2,
                                              transposed=False)
    Q_smem = gl.allocate_shared_memory(gl.float16, [128, D], smem)
    K_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BN, D], smem)
    V_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BN, D], smem)
    preloaded = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    fullK = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    emptyK = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    fullV = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    emptyV = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(preloaded.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(fullK.index(i), count=1)
        mbarrier.init(emptyK.index(i), count=2)
        mbarrier.init(fullV.index(i), count=1)
        mbarrier.init(emptyV.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    args = (q_desc, k_desc, v_desc, out_desc, Q_smem, K_smem, V_smem, preloaded, fullK, emptyK,
            fullV, emptyV, turn, seq_len, qk_scale)
    gl.warp_specialize([(_wg0, args), (_load, args), (_wg1, args)], [1, 4], [24, CONSUMER_REGS])


'''


def variant(D, causal, bn=128, stages=2, split_kv=False, fa3=False, pingpong=False, regs=232):
    """The probe kernel with these switches (``gluon_probes.probe_module``)."""
    knobs = dict(BN=bn, D=D, STAGES=stages, CAUSAL=causal, SPLIT_KV=split_kv or fa3, FA3=fa3,
                 PINGPONG=pingpong, CONSUMER_REGS=regs)
    return probe_module(KERNEL, knobs, "probe_attn").attention_probe


def run_probe(q, k, v, causal, bn=128, **kw):
    B, H, S, D = q.shape
    out = torch.empty_like(q)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False)
    descs = [TensorDescriptor.from_tensor(t, [1, 1, rows, D], layout)
             for t, rows in ((q, 128), (k, bn), (v, bn), (out, 64))]
    grid = (triton_cdiv(S, 128), H, B)
    variant(D, causal, bn=bn, **kw)[grid](*descs, S, LOG2E / math.sqrt(D), num_warps=4)
    return out


def triton_cdiv(a, b):
    return -(-a // b)


VARIANTS = {
    "probe base": dict(),
    "split kv": dict(split_kv=True),
    "pingpong": dict(split_kv=True, pingpong=True),
    "fa3": dict(fa3=True),
    "fa3 + pingpong": dict(fa3=True, pingpong=True),
    "fa3, 3 stages": dict(fa3=True, stages=3),
    "fa3 + pingpong, 3 stages": dict(fa3=True, pingpong=True, stages=3),
    "fa3, bn 256 (D64)": dict(fa3=True, bn=256),
    "fa3 + pingpong, bn 256 (D64)": dict(fa3=True, pingpong=True, bn=256),
}
SHAPES = [(4, 16, 4096, 128), (2, 16, 8192, 128), (8, 16, 2048, 64), (4, 32, 4096, 64), (2, 16, 1000, 128)]


def compile_only() -> int:
    """Compile every variant for sm_90a on this machine (no GPU); print its wgmma count and
    shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as tcompile
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False)
    for D in (128, 64):
        t = torch.empty(1, 1, 256, D, dtype=torch.float16)
        sig_desc = mangle_type(TensorDescriptor.from_tensor(t, [1, 1, 128, D], layout))
        for causal in (False, True):
            for name, kw in VARIANTS.items():
                if kw.get("bn", 128) != 128 and D != 64:
                    continue
                fn = variant(D, causal, **kw)
                sig = {"q_desc": sig_desc, "k_desc": sig_desc, "v_desc": sig_desc, "out_desc": sig_desc,
                       "seq_len": "i32", "qk_scale": "fp32"}
                k = tcompile(GluonASTSource(fn, sig, constexprs={}), target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": 4})
                ptx = k.asm["ptx"]
                print(f"D{D} causal={causal} {name}: wgmma={ptx.count('wgmma.mma_async')} "
                      f"shared bytes={k.metadata.shared}", flush=True)
    return 0


def main(argv) -> int:
    if "--compile-only" in argv:
        return compile_only()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench
    from tilews.ops.attention import attention
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
    rows = []
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            cands = {"tilews auto": lambda: attention(q, k, v, is_causal=causal)}
            for name, kw in VARIANTS.items():
                if kw.get("stages", 2) * 2 * 128 * D * 2 + 128 * D * 2 > 227 * 1024:
                    continue
                if kw.get("bn", 128) != 128 and D != 64:
                    continue
                cands[name] = lambda kw=kw: run_probe(q, k, v, causal, **kw)
            errs = {}
            for name, fn in list(cands.items()):
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    same = torch.equal(out, fn())
                    errs[name] = (err, same)
                    if not (err < 1e-2) or not same:
                        print(f"  WRONG {name}: err {err} deterministic {same}", flush=True)
                        del cands[name]
                except Exception as e:  # noqa: BLE001 - a probe that fails to build is reported
                    print(f"  FAILED {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    del cands[name]
            times = {n: [] for n in ["cudnn", *cands]}
            for _ in range(rounds):
                times["cudnn"].append(do_bench(cudnn, warmup=25, rep=100, return_mode="median"))
                for n, fn in cands.items():
                    times[n].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
            for n in cands:
                r = [c / t for c, t in zip(times["cudnn"], times[n])]
                med = statistics.median(times[n])
                rows.append(dict(shape=f"B{B} H{H} S{S} D{D}", causal=causal, variant=n,
                                 err=errs[n][0], tflops=flops / med / 1e9,
                                 cudnn_tflops=flops / statistics.median(times["cudnn"]) / 1e9,
                                 vs_cudnn=statistics.median(r), lo=min(r), hi=max(r)))
                print(rows[-1], flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_attention.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'shape':22} {'causal':6} {'variant':28} {'TFLOP/s':>8} {'cuDNN':>7} {'ratio':>6} spread")
    for r in rows:
        print(f"{r['shape']:22} {str(r['causal']):6} {r['variant']:28} {r['tflops']:8.0f} "
              f"{r['cudnn_tflops']:7.0f} {r['vs_cudnn']:6.3f} {r['lo']:.3f}-{r['hi']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
