"""Does sharing B between two CTAs through TMA multicast make bf16 large squares faster?

Gluon 3.6 has no cluster or multicast API (its TMA lowering answers "NYI: Support multicast"), so
this probe builds the persistent 128x256x64 warp-specialized GEMM by hand in Gluon and makes the
cluster form by rewriting the PTX Triton produced:

* CTA pairs (2-CTA clusters along x) compute vertically adjacent tiles of the same N column in
  step; each CTA loads its own A tile and half of the shared B tile, multicast to both CTAs
  (``cp.async.bulk.tensor ... .multicast::cluster``, mask 0b11). Each CTA's ``full`` barrier
  still expects the whole stage (its A, its half of B and the peer's).
* A stage is free only when both CTAs' consumers released it: each consumer arrival on ``empty``
  also arrives on the peer's (``mapa`` + ``mbarrier.arrive.shared::cluster``), and ``empty``
  counts 2. With ``.release.cluster`` on that remote arrival the kernel ran at 0.74-0.78x cuBLAS;
  the default (``.release.cta``) is what CUTLASS uses.
* The barriers are initialized at the kernel's start by thread 0, before a cluster barrier that
  all threads pass (Triton's warp-specialized prologue runs on the default partition only, so the
  peer could otherwise arrive on a barrier not yet initialized); the producer waits for the last
  releases of every stage before it exits (the peer's remote arrivals land in this CTA's memory).
* The launch asks for clusters of 2 through Triton's launcher (``num_ctas`` in the packed
  metadata), with the cubin assembled from the rewritten PTX.

Variants, each also without clusters (``pairs``: the same tile order, B loaded whole by each
CTA): 3 stages with the 64 KB staging tile; 4 stages with the epilogue stored in two 128x128
halves through a 32 KB staging tile. Compared with ``tilews.ops.matmul`` and ``torch.matmul``:
CUDA events, L2 flushed (``do_bench``), interleaved rounds, median ratio to ``torch.matmul``.
M and N must be multiples of 256 and K of 64.

    python scripts/probe_cluster_multicast.py [--rounds 11] [--shapes 4096x4096x4096,...]
    python scripts/probe_cluster_multicast.py --compile-only    # CPU: rewrite and assemble only
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

KERNEL = '''
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

BM: gl.constexpr = gl.constexpr(128)
BN: gl.constexpr = gl.constexpr(256)
BK: gl.constexpr = gl.constexpr(64)
G: gl.constexpr = gl.constexpr(8)            # tile pairs per group (16 tile rows)
S: gl.constexpr = gl.constexpr({stages})
HALVES: gl.constexpr = gl.constexpr({halves})  # 2: the epilogue stores 128x128 halves
CLUSTER: gl.constexpr = gl.constexpr({cluster})
layout: gl.constexpr = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                         rank=2, transposed=False))
acc_layout: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                                  instr_shape=[16, 256, 16]))


@gluon.jit
def _tile(pair, PM, PN, rank):
    per = G * PN
    first = (pair // per) * G
    size = gl.minimum(PM - first, G)
    pm = first + (pair % per) % size
    return (2 * pm + rank) * BM, ((pair % per) // size) * BN


@gluon.jit
def _pairs(PM, PN):
    cluster = gl.program_id(0) // 2
    clusters = gl.num_programs(0) // 2
    return cluster, clusters, gl.program_id(0) % 2, (PM * PN - cluster + clusters - 1) // clusters


@gluon.jit
def _consumer(a_d, b_d, c_d, A_s, B_s, C_s, full, empty, PM, PN, KT):
    cluster, clusters, rank, tiles = _pairs(PM, PN)
    for t in range(0, tiles):
        om, on = _tile(cluster + t * clusters, PM, PN, rank)
        acc = gl.full([BM, BN], 0.0, gl.float32, layout=acc_layout)
        for k in range(0, KT):
            it = t * KT + k
            mbarrier.wait(full.index(it % S), (it // S) & 1)
            acc = warpgroup_mma(A_s.index(it % S), B_s.index(it % S), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if k > 0:
                mbarrier.arrive(empty.index((it + S - 1) % S), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((t * KT + KT - 1) % S), count=1)
        if HALVES == 1:
            tma.store_wait(0)
            C_s.store(acc.to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_d, [om, on], C_s)
        else:
            left, right = acc.reshape([BM, 2, BN // 2]).permute(0, 2, 1).split()
            tma.store_wait(0)
            C_s.store(left.to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_d, [om, on], C_s)
            tma.store_wait(0)
            C_s.store(right.to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_d, [om, on + BN // 2], C_s)
    tma.store_wait(0)


@gluon.jit
def _producer(a_d, b_d, c_d, A_s, B_s, C_s, full, empty, PM, PN, KT):
    cluster, clusters, rank, tiles = _pairs(PM, PN)
    for t in range(0, tiles):
        om, on = _tile(cluster + t * clusters, PM, PN, rank)
        for k in range(0, KT):
            it = t * KT + k
            s = it % S
            mbarrier.wait(empty.index(s), ((it // S) & 1) ^ 1)
            mbarrier.expect(full.index(s), (BM + BN) * BK * 2)
            tma.async_copy_global_to_shared(a_d, [om, k * BK], full.index(s), A_s.index(s))
            if CLUSTER:     # this CTA's half of B; the PTX rewrite multicasts it to both CTAs
                if rank == 0:
                    tma.async_copy_global_to_shared(b_d, [k * BK, on], full.index(s),
                                                    B_s.index(s).slice(0, BN // 2, dim=1))
                else:
                    tma.async_copy_global_to_shared(b_d, [k * BK, on + BN // 2], full.index(s),
                                                    B_s.index(s).slice(BN // 2, BN // 2, dim=1))
            else:
                tma.async_copy_global_to_shared(b_d, [k * BK, on], full.index(s),
                                                B_s.index(s).slice(0, BN // 2, dim=1))
                tma.async_copy_global_to_shared(b_d, [k * BK, on + BN // 2], full.index(s),
                                                B_s.index(s).slice(BN // 2, BN // 2, dim=1))
    if CLUSTER:         # every stage released by both consumers before this CTA exits
        for j in range(0, S):
            it = tiles * KT + j
            mbarrier.wait(empty.index(it % S), ((it // S) & 1) ^ 1)


@gluon.jit
def gemm(a_d, b_d, c_d, PM, PN, KT):
    A_s = gl.allocate_shared_memory(gl.bfloat16, [S, BM, BK], layout)
    B_s = gl.allocate_shared_memory(gl.bfloat16, [S, BK, BN], layout)
    C_s = gl.allocate_shared_memory(gl.bfloat16, [BM, BN // HALVES], layout)
    full = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2 if CLUSTER else 1)
    args = (a_d, b_d, c_d, A_s, B_s, C_s, full, empty, PM, PN, KT)
    gl.warp_specialize([(_consumer, args), (_producer, args)], [1], [24])
'''

VARIANTS = {"cluster s3": (True, 3, 1), "cluster s4 halves": (True, 4, 2),
            "pairs s3": (False, 3, 1), "pairs s4 halves": (False, 4, 2)}


def kernel_module(cluster: bool, stages: int, halves: int):
    """The kernel source for one variant, imported (``source_module``)."""
    return source_module(f"multicast_{int(cluster)}_{stages}_{halves}",
                         KERNEL.format(cluster=cluster, stages=stages, halves=halves))


def source_module(name: str, source: str):
    """``source`` written to a file (Triton reads the source of a jit function) and imported as
    module ``name``."""
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_clusters_of_two(compiled, ptx: str):
    """``compiled`` with its cubin assembled from ``ptx`` (a ``rewrite``) and its launch asking for
    clusters of 2 (``num_ctas`` in the packed metadata: Triton's launcher multiplies the grid's x
    by it)."""
    folder = Path(tempfile.mkdtemp())
    (folder / "k.ptx").write_text(ptx)
    subprocess.run([get_ptxas(90).path, "-lineinfo", "--gpu-name=sm_90a", str(folder / "k.ptx"), "-o",
                    str(folder / "k.cubin")], check=True, capture_output=True)
    compiled.kernel = (folder / "k.cubin").read_bytes()
    compiled.packed_metadata = (compiled.metadata.num_warps, 2, compiled.metadata.shared)
    return compiled


def rewrite(ptx: str, shared: int = 1, rank_bytes: int = 0) -> tuple[str, dict]:
    """The cluster form of the kernel's PTX (module docstring): the loads through the kernel's
    ``shared``-th tensor map (0-based, in parameter order; here B's) multicast to both CTAs of
    a pair, each landing ``rank_bytes`` times the CTA's rank in the pair past its written
    destination (0 here: the kernel places each half itself); counts of what it changed."""
    lines = ptx.split("\n")
    b_param = re.findall(r"\.param \.align 64 \.b8 (\w+)\[128\]", ptx)[shared]
    b_regs = {m.group(1) for line in lines
              for m in [re.search(rf"mov\.b64\s+(%rd\d+), {b_param};", line)] if m}
    for line in lines:
        m = re.search(r"cvta\.param\.u64\s+(%rd\d+), (%rd\d+);", line)
        if m and m.group(2) in b_regs:
            b_regs.add(m.group(1))
    smem = {m.group(1) for line in lines for m in [re.search(r"mov\.b32\s+(%r\d+), global_smem;", line)] if m}
    offsets = {m.group(1): int(m.group(3)) for line in lines
               for m in [re.search(r"add\.s32\s+(%r\d+), (%r\d+), (\d+);", line)] if m and m.group(2) in smem}
    inits, out, counts = [], [], dict(multicast=0, remote_arrivals=0, barriers=0)
    copy = re.compile(r"^(\s*)(@%p\d+ )?cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\."
                      r"mbarrier::complete_tx::bytes (\[%r\d+\]), \[(%rd\d+), (\{[^}]*\})\], (\[%r\d+\]);")
    for line in lines:
        m = re.search(r"mbarrier\.init\.shared::cta\.b64 \[(%r\d+)\], (\d+);", line)
        if m:
            inits.append((offsets[m.group(1)], int(m.group(2))))
            counts["barriers"] += 1
            continue
        m = copy.search(line)
        if m and m.group(4) in b_regs:
            indent, pred, dst, desc, coord, bar = m.groups()
            if rank_bytes:      # the copy lands rank_bytes further per rank of the CTA in its pair
                offset = (f".reg .b32 %twk, %twd; mov.u32 %twk, %cluster_ctarank; "
                          f"mad.lo.u32 %twd, %twk, {rank_bytes}, {dst[1:-1]}; ")
                dst = "[%twd]"
            else:
                offset = ""
            out.append(f"{indent}{{ .reg .b16 %twm; {offset}mov.b16 %twm, 3; {pred or ''}cp.async.bulk.tensor.2d."
                       f"shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster {dst}, "
                       f"[{desc}, {coord}], {bar}, %twm; }}")
            counts["multicast"] += 1
            continue
        m = re.search(r"^(\s*)(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\];", line)
        if m:
            indent, pred, bar = m.groups()
            pred = pred or ""
            out.append(f"{indent}{{ .reg .b32 %twr, %twa; mov.u32 %twr, %cluster_ctarank; xor.b32 %twr, %twr, 1; "
                       f"mapa.shared::cluster.u32 %twa, {bar}, %twr; {pred}mbarrier.arrive.shared::cta.b64 _, [{bar}]; "
                       f"{pred}mbarrier.arrive.shared::cluster.b64 _, [%twa]; }}")
            counts["remote_arrivals"] += 1
            continue
        out.append(line)
    start = next(i for i, line in enumerate(out) if line.strip() == "// %bb.0:") + 1
    prologue = ["\t{ .reg .pred %twp; .reg .b32 %twt, %twb; mov.u32 %twt, %tid.x; setp.eq.u32 %twp, %twt, 0; "
                "mov.b32 %twb, global_smem;"]
    prologue += [f"\t  {{ .reg .b32 %twx; add.s32 %twx, %twb, {off}; @%twp mbarrier.init.shared::cta.b64 [%twx], {n}; }}"
                 for off, n in inits]
    prologue.append("\t  fence.mbarrier_init.release.cluster; bar.sync 0; barrier.cluster.arrive.release.aligned; "
                    "barrier.cluster.wait.acquire.aligned; }")
    out[start:start] = prologue
    return "\n".join(out), counts


def build(variant: str, descriptors: tuple):
    """The variant compiled for sm_90a; the cluster ones re-assembled from the rewritten PTX and
    launched in clusters of 2."""
    cluster, stages, halves = VARIANTS[variant]
    fn = kernel_module(cluster, stages, halves).gemm
    signature = {"a_d": mangle_type(descriptors[0]), "b_d": mangle_type(descriptors[1]),
                 "c_d": mangle_type(descriptors[2]), "PM": "i32", "PN": "i32", "KT": "i32"}
    compiled = triton.compile(GluonASTSource(fn, signature, {}, {}), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 8})
    if not cluster:
        return compiled, None
    ptx, counts = rewrite(compiled.asm["ptx"])
    assert counts == dict(multicast=4, remote_arrivals=2, barriers=2 * stages), counts
    return in_clusters_of_two(compiled, ptx), counts


def descriptors(a, b, c, halves: int):
    from triton.experimental.gluon.language import NVMMASharedLayout
    layout = NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False)
    return (TensorDescriptor.from_tensor(a, [128, 64], layout), TensorDescriptor.from_tensor(b, [64, 128], layout),
            TensorDescriptor.from_tensor(c, [128, 256 // halves], layout))


def runner(variant: str, a, b, compiled: dict):
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty(M, N, dtype=torch.bfloat16, device=a.device)
    cluster, _, halves = VARIANTS[variant]
    descs = descriptors(a, b, c, halves)
    if variant not in compiled:
        compiled[variant] = build(variant, descs)[0]
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    launch = compiled[variant][(sms // 2 if cluster else sms // 2 * 2, 1, 1)]

    def run():
        launch(*descs, M // 256, N // 256, K // 64)
        return c
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--shapes", default="4096x4096x4096,8192x4096x4096,8192x8192x8192")
    ap.add_argument("--compile-only", action="store_true", help="rewrite and assemble each variant (no GPU)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.compile_only:
        meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
        for variant, (_, _, halves) in VARIANTS.items():
            compiled, counts = build(variant, descriptors(meta(512, 256), meta(256, 512), meta(512, 512), halves))
            print(f"{variant}: {compiled.metadata.shared} bytes of shared memory, rewrite {counts}")
        return
    from tilews import ops
    from tilews.testing import rel_err, time_ms
    rows, compiled = [], {}
    for text in args.shapes.split(","):
        M, N, K = map(int, text.split("x"))
        a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
        cands = {v: runner(v, a, b, compiled) for v in VARIANTS}
        cands["ops.matmul"] = lambda: ops.matmul(a, b)
        cands["torch"] = lambda: torch.matmul(a, b)
        ref, errs = a.double() @ b.double(), {}
        for name, fn in cands.items():
            fn().fill_(float("nan"))
            errs[name] = rel_err(fn(), ref)
            assert errs[name] < 1e-2, (text, name, errs[name])
        times = {name: [] for name in cands}
        for r in range(args.rounds):
            for name in (list(cands) if r % 2 else list(cands)[::-1]):
                times[name].append(time_ms(cands[name], a.device))
        for name in cands:
            if name == "torch":
                continue
            ratio = sorted(t / o for t, o in zip(times["torch"], times[name]))
            q = len(ratio) // 4
            rows.append(dict(shape=text, variant=name, err=errs[name], us=1e3 * statistics.median(times[name]),
                             torch_us=1e3 * statistics.median(times["torch"]), vs=statistics.median(ratio),
                             q1=ratio[q], q3=ratio[-q - 1], lo=ratio[0], hi=ratio[-1], rounds=args.rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| shape | variant | err | us (torch) | vs torch.matmul: median (middle half; min-max) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['variant']} | {r['err']:.1e} | {r['us']:.1f} ({r['torch_us']:.1f}) | "
              f"{r['vs']:.3f}x ({r['q1']:.3f}-{r['q3']:.3f}; {r['lo']:.3f}-{r['hi']:.3f}) |")


if __name__ == "__main__":
    main()
