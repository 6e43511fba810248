"""Probe (outside the project's programs): can ONE kernel beat cuBLAS at M <= 32, where
``tilews.ops.matmul``'s split-K pays for a second (reduction) kernel?

Times, as ``tilews-bench`` does (L2 flushed, CUDA events, interleaved rounds), against
``torch.matmul``: ``tilews.ops.matmul`` as it is, its split-K partial kernel alone (what the
reduction costs), and a hand-written ``triton.language`` split-K whose last-arriving block of each
output tile sums the slices in slice order (deterministic) in the same kernel: each block stores its
float32 partial, then increments the tile's counter (acq_rel); the block that sees ``splits - 1``
reads the partials, writes C and resets the counter.

    python scripts/probe_narrow_gemm.py [--rounds N] [--tilews | --wide] [--shapes MxNxK,...]

``--tilews``: the same timing of what became of it, ``tilews.ops.matmul`` (the heuristic) and
the split-K schedules of ``tilews.ops``'s tuning space (``split_k_fused``, and ``split_k`` in 2), at
M = 1..512 and the ragged shapes. ``--wide``: every schedule of the tuning space at M = 128 and 512
and two ragged shapes (where the warp-specialized split_k_fused competes with tiles).
"""
from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

import tilews
import tilews.ops
from tilews.ops import run
from tilews.ops.matmul import _runner, matmul_schedule
from tilews.ops.schedule import Schedule, bucket, candidates


@triton.jit
def split_k_fixup(a, b, c, ws, counters, M, N, K, k_per,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLITS: tl.constexpr,
                  STAGES: tl.constexpr):
    pid_n, pid_m, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    k0 = s * k_per
    for kk in tl.range(0, k_per, BK, num_stages=STAGES):
        rk = k0 + kk + tl.arange(0, BK)
        at = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        bt = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(at, bt, acc)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None] * N + rn[None, :]
    tl.store(ws + s * M * N + offs, acc, mask=mask)
    tl.debug_barrier()
    tile = pid_m * tl.num_programs(0) + pid_n
    seen = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
    if seen == SPLITS - 1:
        total = tl.zeros((BM, BN), tl.float32)
        for t in tl.static_range(SPLITS):
            total += tl.load(ws + t * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(c + offs, total.to(c.dtype.element_ty), mask=mask)
        tl.atomic_xchg(counters + tile, 0)


class Fixup:
    def __init__(self, M, N, K, BM, BN, BK, splits, stages, warps):
        self.cfg = (BM, BN, BK, splits, stages, warps)
        ktiles = triton.cdiv(K, BK)
        self.k_per = triton.cdiv(ktiles, splits) * BK
        self.grid = (triton.cdiv(N, BN), triton.cdiv(M, BM), splits)
        self.ws = torch.empty(splits * M * N, device="cuda", dtype=torch.float32)
        self.counters = torch.zeros(self.grid[0] * self.grid[1], device="cuda", dtype=torch.int32)

    def __call__(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N, device=a.device, dtype=a.dtype)
        BM, BN, BK, splits, stages, warps = self.cfg
        split_k_fixup[self.grid](a, b, c, self.ws, self.counters, M, N, K, self.k_per, BM=BM, BN=BN,
                                 BK=BK, SPLITS=splits, STAGES=stages, num_warps=warps)
        return c

    def __str__(self):
        BM, BN, BK, splits, stages, warps = self.cfg
        return f"fixup {BM}x{BN}x{BK} x{splits} s{stages} w{warps}"


def _attempt(fn, a, b):
    try:
        fn(a, b)
    except Exception as e:  # noqa: BLE001  (reported with the shape's rows)
        return e
    return None


def cold_ms(fn, a, b):
    return triton.testing.do_bench(lambda: fn(a, b), warmup=5, rep=25, return_mode="median")


def handwritten(M, N, K, a, b, sms):
    """ops.matmul, its split-K partial kernel alone, and the hand-written fixup kernels."""
    cands = {"ops.matmul": tilews.ops.matmul}
    sched = matmul_schedule(a, b)
    if sched.program == "split_k":
        part = _runner(sched, N, K, a.dtype, a.dtype, "cuda", "tf32").kernels[0]
        cands[f"partial only ({sched})"] = lambda x, y, p=part: p(x, y)
    BM = 16 if M <= 16 else (32 if M <= 32 else 64)
    for BN in (64, 128):
        for BK in (64, 128):
            tiles = triton.cdiv(N, BN) * triton.cdiv(M, BM)
            for want in (1, 2, 3):
                splits = max(1, min(16, round(want * sms / tiles)))
                if K // splits >= 2 * BK:
                    f = Fixup(M, N, K, BM, BN, BK, splits, 4, 4)
                    cands.setdefault(str(f), f)
    return cands


def schedules(M, N, K, a, b, sms, texts=None):
    """ops.matmul (its heuristic, or the tuned winner) and every split-K schedule of the tuning
    space (or the schedules ``texts`` name) through tilews.ops.run."""
    cands = {f"ops.matmul ({matmul_schedule(a, b)})": tilews.ops.matmul}
    if texts:
        return {**cands, **{t: lambda x, y, s=Schedule.from_text(t): run(x, y, None, s)
                            for t in texts.split(";")}}
    for s in candidates(bucket(M), N, K, a.dtype, a.dtype, sms, True):
        if s.program == "split_k_fused" or s.program == "split_k" and s.splits == 2 or M > 64:
            cands[str(s)] = lambda x, y, s=s: run(x, y, None, s)
    return cands


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tilews", action="store_true",
                    help="time tilews.ops's split-K schedules instead of the hand-written kernel")
    ap.add_argument("--wide", action="store_true",
                    help="tilews only, at M >= 128: every schedule of the tuning space")
    ap.add_argument("--shapes", help="MxNxK,... instead of the mode's shapes")
    ap.add_argument("--schedules", help="'text;text;...' (Schedule.from_text): time these instead "
                                        "of the tuning space's")
    args = ap.parse_args()
    sms = tilews.num_sms()
    shapes = [(M, N, K) for N, K in ((4096, 4096), (14336, 4096), (4096, 14336)) for M in (1, 16, 32)]
    if args.wide:
        shapes = [(M, N, K) for M in (128, 512) for N, K in ((4096, 4096), (14336, 4096), (4096, 14336))]
        shapes += [(1000, 1100, 1234), (777, 512, 4096)]
    elif args.tilews:
        shapes += [(M, 4096, 4096) for M in (128, 512)] + [(512, 4096, 14336), (1000, 1100, 1234),
                                                          (777, 512, 4096), (4095, 4097, 4099)]
    if args.shapes:
        shapes = [tuple(int(v) for v in t.split("x")) for t in args.shapes.split(",")]
    rows, work, summary = [], [], []
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
        cands = (schedules(M, N, K, a, b, sms, args.schedules) if args.tilews or args.wide or args.schedules
                 else handwritten(M, N, K, a, b, sms))
        work.append((M, N, K, a, b, cands))
    # compile everything first, threads overlapping the compiles (Gluon's are child processes)
    jobs = [(name, fn, a, b) for *_, a, b, cands in work for name, fn in cands.items()]
    first = [_attempt(*jobs[0][1:])]
    failed = {(id(fn), id(a)): e for (_, fn, a, _), e in
              zip(jobs, first + list(ThreadPoolExecutor(8).map(lambda j: _attempt(*j[1:]), jobs[1:])))
              if e is not None}
    for M, N, K, a, b, cands in work:
        ref = a.float() @ b.float()
        live = {}
        for name, fn in cands.items():
            try:
                if (id(fn), id(a)) in failed:
                    raise failed[id(fn), id(a)]
                for _ in range(2):          # twice: the counters must come back to 0
                    out = fn(a, b)
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if "partial" in name or err < 1e-2:
                    live[name] = fn
                else:
                    print(f"{M}x{N}x{K} {name}: WRONG rel err {err:.3g}")
            except Exception as e:  # noqa: BLE001
                print(f"{M}x{N}x{K} {name}: {type(e).__name__}: {str(e)[:200]}")
        res = {n: [] for n in live}
        for _ in range(args.rounds):
            for n, fn in live.items():
                t_ref = cold_ms(torch.matmul, a, b)
                t = cold_ms(fn, a, b)
                res[n].append((t_ref / t, t * 1e3, t_ref * 1e3))
        shape = f"{M}x{N}x{K}"
        for n, r in res.items():
            rows.append((shape, n, statistics.median(x[0] for x in r), min(x[0] for x in r),
                         max(x[0] for x in r), statistics.median(x[1] for x in r),
                         statistics.median(x[2] for x in r)))
        mine = [r for r in rows if r[0] == shape]
        best = max(mine, key=lambda r: r[2] if "partial" not in r[1] else 0)
        ops = next(r for r in mine if r[1].startswith("ops.matmul"))
        summary.append(f"{shape}: {ops[1]} {ops[2]:.2f}x  best {best[1]} {best[2]:.2f}x "
                       f"({best[5]:.1f} us, cuBLAS {best[6]:.1f})")
        print(summary[-1], flush=True)
    print("| shape | kernel | vs torch.matmul | min-max | us | cuBLAS us |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.2f}-{r[4]:.2f} | {r[5]:.1f} | {r[6]:.1f} |")
    print("\n".join(summary))                  # last: the shortest answer


if __name__ == "__main__":
    main()
