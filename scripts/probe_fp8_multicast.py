"""Is TMA multicast between two CTAs what makes cuBLAS faster on FP8 128 x 4096 x 14336 back to back?

``tilews.ops.fp8_scaled_mm`` runs this shape swapped (C^T = W X^T) in 64 x 64 tiles: 128 blocks,
the two blocks of a weight tile (X's two 64-row tiles) neighbours in launch order, 12 stages of
(W, X) k-blocks of 128, one consumer warp group promoting each k-block's FP8 partial into float32
under the next k-block's wgmma. Replayed back to back from CUDA graphs it runs at 0.93-0.96x
cuBLAS, whose kernel (``nvjet_sm90_qqtst_64x64_128x13_1x2``) launches clusters of 2 that share a
tile by TMA multicast; alone, under Nsight Compute's fixed clocks, ours is 1.02x
(docs/performance.md, FP8 "Decode shapes").

This probe writes that kernel by hand in Gluon (the op's schedule, the same tiles, stages and
promotion, PDL as the op launches) in four forms, and times them beside the op and cuBLAS:

* ``pairs W``: each block loads its whole weight tile, as two 32-row boxes;
* ``cluster W``: the two blocks of a weight tile (X's two tiles) form a cluster of 2; each loads
  one 32-row half of the weight tile, multicast to both;
* ``pairs X`` / ``cluster X``: the same with the pair sharing X's tile (blocks of neighbouring
  weight tiles, as cuBLAS's 1 x 2 clusters share A).

The cluster forms come from ``scripts/probe_cluster_multicast.py``'s PTX rewrite: the shared
tile's copy multicast, landing at the CTA's rank's half (no branch on the rank in the producer:
one cost the branch-free forms nothing but every branching form 15%), each consumer release also
arriving on the peer's ``empty`` barrier (count 2), barrier set-up before a cluster barrier, the
producer waiting for the last releases before it exits. L2 -> SM traffic: 176 MB a call against
235 MB.

Timing as ``probe_fp8_graph_time.py``: each side a CUDA graph of 10 passes of back-to-back calls
over input sets holding >= 160 MB of weights, rounds rotating the order; speed = cuBLAS time /
the side's (median, min..max over rounds). Every side's result is checked against
``torch._scaled_mm`` (per-tensor scales, bf16 out) first; JSON to ``--json``.

    python scripts/probe_fp8_multicast.py [--rounds 7] [--shape 128x4096x14336]
    python scripts/probe_fp8_multicast.py --compile-only     # CPU: rewrite and assemble only
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from probe_cluster_multicast import in_clusters_of_two, rewrite, source_module

KERNEL = '''
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

S: gl.constexpr = gl.constexpr({stages})
KT: gl.constexpr = gl.constexpr({k_blocks})      # k-blocks of 128 (even)
CLUSTER: gl.constexpr = gl.constexpr({cluster})
SHARE_X: gl.constexpr = gl.constexpr({share_x})
smem_layout: gl.constexpr = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                                              rank=2, transposed=False))
acc_layout: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                  instr_shape=[16, 64, 32]))


@gluon.jit
def _consumer(w_d, x_d, W_s, X_s, full, empty, scale_w, scale_x, out, out_s0, out_s1):
    gdc_wait()
    gdc_launch_dependents()
    mx, nw, rank = _coords()
    odd = gl.zeros([64, 64], gl.float32, layout=acc_layout)
    even = gl.zeros([64, 64], gl.float32, layout=acc_layout)
    acc = gl.zeros([64, 64], gl.float32, layout=acc_layout)
    mbarrier.wait(full.index(0), 0)
    odd = warpgroup_mma(W_s.index(0), X_s.index(0).permute((1, 0)), odd, use_acc=False, is_async=True)
    odd, even = warpgroup_mma_wait(num_outstanding=0, deps=(odd, even))
    for k in range(1, KT - 1, 2):
        t = (k + 1) % S
        mbarrier.arrive(empty.index((k - 1) % S), count=1)
        mbarrier.wait(full.index(k % S), (k // S) & 1)
        even = warpgroup_mma(W_s.index(k % S), X_s.index(k % S).permute((1, 0)), even, use_acc=False,
                             is_async=True)
        acc = acc + odd
        mbarrier.wait(full.index(t), ((k + 1) // S) & 1)
        odd = warpgroup_mma(W_s.index(t), X_s.index(t).permute((1, 0)), odd, use_acc=False, is_async=True)
        odd, even = warpgroup_mma_wait(num_outstanding=1, deps=(odd, even))
        mbarrier.arrive(empty.index(k % S), count=1)
        acc = acc + even
        odd, even = warpgroup_mma_wait(num_outstanding=0, deps=(odd, even))
    mbarrier.arrive(empty.index((KT - 2) % S), count=1)
    mbarrier.wait(full.index((KT - 1) % S), ((KT - 1) // S) & 1)
    even = warpgroup_mma(W_s.index((KT - 1) % S), X_s.index((KT - 1) % S).permute((1, 0)), even,
                         use_acc=False, is_async=True)
    acc = acc + odd
    odd, even = warpgroup_mma_wait(num_outstanding=0, deps=(odd, even))
    mbarrier.arrive(empty.index((KT - 1) % S), count=1)
    acc = acc + even
    acc = acc * gl.load(scale_w) * gl.load(scale_x)
    i = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout)), 1)
    j = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, acc_layout)), 0)
    gl.store(out + (mx * 64 + j) * out_s0 + (nw * 64 + i) * out_s1, acc.to(gl.bfloat16))


@gluon.jit
def _coords():
    """(X's tile, W's tile, rank in the pair): pairs share W (neighbours along x = X's tiles) or,
    with SHARE_X, share X (neighbours along x = W's tiles)."""
    if SHARE_X:
        return gl.program_id(1), gl.program_id(0), gl.program_id(0) % 2
    else:
        return gl.program_id(0), gl.program_id(1), gl.program_id(0) % 2


@gluon.jit
def _shared_tile(desc, row, col, bar, dst, rank):
    """The pair's shared 64-row tile at (row, col): in a cluster, this CTA's 32-row half (the PTX
    rewrite multicasts it to both CTAs and moves its destination by the rank's 4096 bytes: no
    branch on the rank here); else both halves."""
    if CLUSTER:
        tma.async_copy_global_to_shared(desc, [row + rank * 32, col], bar, dst.slice(0, 32, dim=0))
    else:
        tma.async_copy_global_to_shared(desc, [row, col], bar, dst.slice(0, 32, dim=0))
        tma.async_copy_global_to_shared(desc, [row + 32, col], bar, dst.slice(32, 32, dim=0))


@gluon.jit
def _producer(w_d, x_d, W_s, X_s, full, empty, scale_w, scale_x, out, out_s0, out_s1):
    gdc_wait()
    mx, nw, rank = _coords()
    for k in range(0, KT):
        s = k % S
        mbarrier.wait(empty.index(s), ((k // S) & 1) ^ 1)
        mbarrier.expect(full.index(s), 16384)
        if SHARE_X:
            tma.async_copy_global_to_shared(w_d, [nw * 64, k * 128], full.index(s), W_s.index(s))
            _shared_tile(x_d, mx * 64, k * 128, full.index(s), X_s.index(s), rank)
        else:
            _shared_tile(w_d, nw * 64, k * 128, full.index(s), W_s.index(s), rank)
            tma.async_copy_global_to_shared(x_d, [mx * 64, k * 128], full.index(s), X_s.index(s))
    if CLUSTER:          # every stage released by both consumers before this CTA exits
        for j in range(0, S):
            it = KT + j
            mbarrier.wait(empty.index(it % S), ((it // S) & 1) ^ 1)


@gluon.jit
def scaled_mm_t(w_d, x_d, scale_w, scale_x, out, out_s0, out_s1):
    W_s = gl.allocate_shared_memory(gl.float8e4nv, [S, 64, 128], smem_layout)
    X_s = gl.allocate_shared_memory(gl.float8e4nv, [S, 64, 128], smem_layout)
    full = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2 if CLUSTER else 1)
    gl.thread_barrier()
    args = (w_d, x_d, W_s, X_s, full, empty, scale_w, scale_x, out, out_s0, out_s1)
    gl.warp_specialize([(_consumer, args), (_producer, args)], [1], [24])
'''

STAGES = 12
BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
# name -> (clusters of 2 with multicast, the pair shares X's tile instead of W's)
VARIANTS = {"pairs W": (False, False), "cluster W": (True, False),
            "pairs X": (False, True), "cluster X": (True, True)}


def kernel_module(cluster: bool, share_x: bool, k_blocks: int):
    """The kernel source for one variant, imported."""
    return source_module(f"fp8_multicast_{int(cluster)}_{int(share_x)}_{k_blocks}",
                         KERNEL.format(cluster=cluster, share_x=share_x, stages=STAGES, k_blocks=k_blocks))


def descriptors(w, x, share_x: bool):
    """The tensor maps of W and X: the shared operand's in 32-row boxes (a CTA's half), the other's
    in 64-row ones."""
    from triton.experimental.gluon.language import NVMMASharedLayout
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2, transposed=False)
    return (TensorDescriptor.from_tensor(w, [64 if share_x else 32, 128], layout),
            TensorDescriptor.from_tensor(x, [32 if share_x else 64, 128], layout))


def build(variant: str, k_blocks: int, w_d, x_d):
    """The variant compiled for sm_90a (PDL on, as the op's kernels); a cluster one re-assembled
    from the rewritten PTX and launched in clusters of 2."""
    cluster, share_x = VARIANTS[variant]
    fn = kernel_module(cluster, share_x, k_blocks).scaled_mm_t
    signature = {"w_d": mangle_type(w_d), "x_d": mangle_type(x_d), "scale_w": "*fp32", "scale_x": "*fp32",
                 "out": "*bf16", "out_s0": "i32", "out_s1": "i32"}
    compiled = triton.compile(GluonASTSource(fn, signature, {}, {}), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "launch_pdl": True})
    if not cluster:
        return compiled, None
    ptx, counts = rewrite(compiled.asm["ptx"], shared=int(share_x), rank_bytes=32 * 128)
    assert counts == dict(multicast=1, remote_arrivals=4, barriers=2 * STAGES), counts
    return in_clusters_of_two(compiled, ptx), counts


def operands(m: int, n: int, k: int, device="cuda") -> tuple:
    """(x, w.t(), scale_x, scale_w): ``_scaled_mm``'s inputs, random e4m3, per-tensor scales."""
    def fp8(*shape):
        return (torch.randn(*shape, device=device) / 2).to(E4M3)
    return fp8(m, k), fp8(n, k).t(), torch.tensor(0.7, device=device), torch.tensor(1.3, device=device)


def hand_call(compiled, variant: str, x, wt, sx, sw):
    """A call of the hand-written kernel on ``_scaled_mm``'s inputs (descriptors made once)."""
    cluster, share_x = VARIANTS[variant]
    w = wt.t()
    m, n = x.shape[0], w.shape[0]
    out = torch.empty(m, n, dtype=BF16, device=x.device)
    w_d, x_d = descriptors(w, x, share_x)
    along, other = (n // 64, m // 64) if share_x else (m // 64, n // 64)
    launch = compiled[(along // (2 if cluster else 1), other, 1)]   # the launcher multiplies x by 2

    def run():
        launch(w_d, x_d, sw, sx, out, out.stride(0), out.stride(1))
        return out
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="128x4096x14336", help="MxNxK (M = 128; N a multiple of 64; "
                                                              "K a multiple of 256)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--compile-only", action="store_true", help="rewrite and assemble (no GPU)")
    ap.add_argument("--json")
    args = ap.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    assert m == 128 and n % 64 == 0 and k % 256 == 0, "M = 128, N % 64 == 0, K % 256 == 0"
    if args.compile_only:
        x, wt, _, _ = operands(m, n, k, device="cpu")
        for variant, (_, share_x) in VARIANTS.items():
            compiled, counts = build(variant, k // 128, *descriptors(wt.t(), x, share_x))
            print(f"{variant}: shared {compiled.metadata.shared} B, rewrite {counts}")
        return
    from peer_compare import capture_graph, launches_ms
    from tilews.ops import fp8_scaled_mm

    sets = [operands(m, n, k) for _ in range(max(2, -(-160 * 2**20 // (n * k))))]
    want = torch._scaled_mm(*sets[0], out_dtype=BF16).float()
    sides = {"op": [lambda s=s: fp8_scaled_mm(*s, out_dtype=BF16) for s in sets]}
    for variant, (_, share_x) in VARIANTS.items():
        kernel = build(variant, k // 128, *descriptors(sets[0][1].t(), sets[0][0], share_x))[0]
        sides[variant] = [hand_call(kernel, variant, *s) for s in sets]
    sides["cublas"] = [lambda s=s: torch._scaled_mm(*s, out_dtype=BF16) for s in sets]
    errors = {}
    for name, calls in sides.items():
        got = calls[0]()
        torch.cuda.synchronize()
        errors[name] = float((got.float() - want).abs().max() / want.abs().max())
        if errors[name] > 1e-2:
            raise AssertionError(f"{name}: relative error {errors[name]:.2e} against torch._scaled_mm")
    graphs = {name: capture_graph(lambda calls=calls: [c() for c in calls], 10) for name, calls in sides.items()}
    us = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            us[name].append(launches_ms(graphs[name].replay, 20.0) / (10 * len(sets)) * 1000)
    rows = {}
    for name in names:
        ratios = [c / o for o, c in zip(us[name], us["cublas"])]
        rows[name] = dict(us=statistics.median(us[name]), speed=statistics.median(ratios), lo=min(ratios),
                          hi=max(ratios), rel_err=errors[name])
    print(f"{args.shape}, {args.rounds} rounds, {torch.cuda.get_device_name()}")
    print(f"{'side':<10} {'us':>7} {'speed vs cuBLAS':>16} {'range':>13} {'rel err':>9}")
    for name, r in rows.items():
        print(f"{name:<10} {r['us']:>7.2f} {r['speed']:>16.3f} {r['lo']:>6.3f}..{r['hi']:<6.3f} {r['rel_err']:>9.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
