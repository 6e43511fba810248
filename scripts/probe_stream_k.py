"""Probe: where does ``gemm_programs.stream_k``'s time go? Times, as ``tilews-bench`` does (L2
flushed, interleaved rounds, median ratio to ``torch.matmul``), at 4096^3 and 8192^3 bf16:

* ``persistent`` (g8, g16), the data-parallel baseline;
* ``stream_k`` as ``tilews.ops`` runs it (whole tiles first, then the shared segments);
* ``no fixup``: the same schedule, but a partial segment stores nothing (wrong results: what
  the segments cost without the partials' traffic and sums);
* ``shared first``: the shared segments, then the whole tiles, with the fixup.

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


@tilews.jit(out_idx=[-1])
def no_fixup(M, N, K, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256,
             num_sms=132, group_size=16, dtype=T.bfloat16):
    """``stream_k``'s units and loops, but a segment covering part of a tile stores nothing."""
    tm, tn = -(-M // block_M), -(-N // block_N)
    ipt = -(-K // block_K)
    sk = G.StreamK.plan(tm * tn, ipt, num_sms)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(num_sms, threads=threads) as b:
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            for u in T.Persistent([sk.units], num_sms, b):
                t, k_lo, k_hi = sk.unit(b, u, False)
                by, bx = T.grouped_tile(t, [tm, tn], group_size)
                G._k_range(A, B, A_s, B_s, C_f, by, bx, k_lo, k_hi, num_stages)
                if k_hi - k_lo == ipt:
                    T.copy(C_f, C[by * block_M, bx * block_N])
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
        cands["shared first"] = G.stream_k(M, N, K, num_sms=sms, shared_first=True)
        cands["no fixup"] = no_fixup(M, N, K, num_sms=sms)
        calls = {n: (lambda k=k: k(a, b)) if n.startswith(("persistent", "no")) else
                 (lambda k=k: k(a, b, counters)[-1]) for n, k in cands.items()}
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
