"""Probe: where does ``gemm_programs.stream_k``'s time go? Times, as ``tilews-bench`` does (L2
flushed, interleaved rounds, median ratio to ``torch.matmul``), at 4096^3 and 8192^3 bf16:

* ``persistent`` (g8, g16), the data-parallel baseline;
* ``stream_k`` as ``tilews.ops`` runs it (shared segments first, then whole tiles);
* ``no fixup``: the same schedule, but a partial segment stores nothing (wrong results: what
  the segments cost without the partials' traffic and sums);
* ``whole tiles first``: the whole tiles, then the shared segments, with the fixup.

    python scripts/probe_stream_k.py [--rounds N] [--shapes MxNxK,...]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton

import tilews
import tilews.language as T
from tilews.ops import gemm_programs as G
from tilews.ops.arrivals import arrival_counters


@tilews.jit(out_idx=[-2, -1])
def variant(M, N, K, fixup=True, whole_first=False, block_M=128, block_N=256, block_K=64,
            num_stages=3, threads=256, num_sms=132, group_size=16, dtype=T.bfloat16):
    tm, tn = -(-M // block_M), -(-N // block_N)
    ipt = -(-K // block_K)
    sk = G.StreamK.plan(tm * tn, ipt, num_sms)
    segs, slots = sk.segments, max(sk.slots, 1)
    dp = tm * tn - sk.sk_tiles

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             Arrivals: T.Tensor((G.ARRIVAL_SLOTS,), T.int32),
             W: T.Tensor((max(sk.sk_tiles, 1) * slots * block_M, block_N), T.float32),
             C: T.Tensor((M, N), dtype)):
        with T.Kernel(num_sms, threads=threads) as b:
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            for u in T.Persistent([num_sms * segs + dp], num_sms, b):
                if whole_first:
                    shared = u >= dp
                    r = T.if_then_else(shared, (u - dp) // num_sms, 0)
                    whole_tile = sk.sk_tiles + u
                else:
                    r = u // num_sms
                    shared = r < segs
                    whole_tile = sk.sk_tiles + u - num_sms * segs
                lo = sk.first_iter(b)
                t = T.if_then_else(shared, lo // ipt + r, whole_tile)
                k_lo = T.if_then_else(shared, T.max(lo - t * ipt, 0), 0)
                k_hi = T.if_then_else(shared, T.min(sk.first_iter(b + 1) - t * ipt, ipt), ipt)
                by, bx = T.grouped_tile(t, [tm, tn], group_size)
                T.clear(C_f)
                for k in T.Pipelined(k_lo, k_hi, num_stages=num_stages):
                    T.copy(A[by * block_M, k * block_K], A_s)
                    T.copy(B[k * block_K, bx * block_N], B_s)
                    T.gemm(A_s, B_s, C_f)
                if k_hi - k_lo == ipt:
                    T.copy(C_f, C[by * block_M, bx * block_N])
                elif fixup:
                    if k_lo < k_hi:
                        first = sk.owner(t * ipt)
                        parts = sk.owner((t + 1) * ipt - 1) - first + 1
                        T.copy(C_f, W[(t * slots + b - first) * block_M, 0])
                        arrived = T.atomic_add(Arrivals[t], 1, memory_order="acq_rel", return_prev=True)
                        if arrived == parts - 1:
                            T.clear(C_f)
                            for s in T.serial(parts):
                                for i, j in T.Parallel(block_M, block_N):
                                    C_f[i, j] += W[(t * slots + s) * block_M + i, j]
                            T.copy(C_f, C[by * block_M, bx * block_N])
                            T.atomic_add(Arrivals[t], -parts)
    return main


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192")
    args = ap.parse_args()
    sms = tilews.num_sms()
    rows = []
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
        counters = arrival_counters(a.device, 1 << 14)
        cands = {f"persistent g{g}": G.persistent(M, N, K, num_sms=sms, group_size=g) for g in (8, 16)}
        cands["stream_k"] = G.stream_k(M, N, K, num_sms=sms)
        cands["no fixup"] = variant(M, N, K, fixup=False, num_sms=sms)
        cands["whole tiles first"] = variant(M, N, K, whole_first=True, num_sms=sms)
        scratch = torch.zeros(1 << 14, dtype=torch.int32, device="cuda")
        calls = {n: (lambda k=k: k(a, b)) if n.startswith("persistent") else
                 (lambda k=k, c=scratch if n == "no fixup" else counters: k(a, b, c)[-1])
                 for n, k in cands.items()}
        ref = a.float() @ b.float()
        for n, f in calls.items():
            err = ((f().float() - ref).norm() / ref.norm()).item()
            print(f"{shape} {n}: rel err {err:.2e}", flush=True)
        res = {n: [] for n in calls}
        for _ in range(args.rounds):
            for n, f in calls.items():
                t_ref = triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=5, rep=40)
                t = triton.testing.do_bench(f, warmup=5, rep=40)
                res[n].append((t_ref / t, t * 1e3))
        for n, r in res.items():
            rows.append((shape, n, statistics.median(x[0] for x in r), min(x[0] for x in r),
                         max(x[0] for x in r), statistics.median(x[1] for x in r)))
    print("| shape | kernel | vs torch.matmul | min-max | us |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.2f}-{r[4]:.2f} | {r[5]:.1f} |")


if __name__ == "__main__":
    main()
