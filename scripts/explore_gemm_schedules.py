"""Kernel time of each GEMM schedule of ``tilews.ops.gemm_programs`` at LLM and ragged shapes,
against torch.matmul in the same run: CUDA-graph replays (launch overhead excluded; operands that
fit stay in L2 between replays), interleaved rounds, median ratio per (shape, schedule). Data for
``tilews.ops``'s schedule heuristic. ``--cold`` times as ``tilews-bench`` does instead: CUDA-event
medians of single calls with L2 flushed before each (``triton.testing.do_bench``), rotating input
sets (``bench.timing``), so every call reads its operands from HBM, as a decode step reads weights.
``--narrow``: only M = 1..128 at N = K = 4096 and N = 4096, K = 14336, with more split-K tiles.

    python scripts/explore_gemm_schedules.py [--quick] [--small] [--narrow] [--cold] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton.language  # noqa: F401  (imported once here: Triton's first import is not thread-safe)

import tilews
import tilews.language as T
from tilews.ops import gemm_programs as g

LLM_NK = ((4096, 4096), (14336, 4096), (4096, 14336))
LLM_M = (1, 16, 32, 128, 512, 2048, 8192)
RAGGED = ((1000, 1100, 1234), (513, 257, 129), (777, 512, 4096), (4095, 4097, 4099))
SQUARE = ((4096, 4096, 4096), (8192, 8192, 8192))


SPLITS = ((64, 128, 2), (64, 128, 4), (64, 128, 8), (64, 64, 4), (128, 128, 4))
SMALL_SPLITS = ((64, 128, 2), (64, 128, 3), (64, 128, 4), (64, 128, 8), (64, 128, 16), (64, 64, 2),
                (64, 64, 4), (64, 64, 8), (64, 256, 2), (64, 256, 4), (128, 128, 2), (128, 128, 4))


def candidates(N, K, M=None):
    """(name, build) pairs; build() -> callable(a, b) -> c. M None: a runtime M (LLM shapes)."""
    Mv = T.dynamic("M") if M is None else M
    hop = lambda f: tilews.jit(out_idx=[-1], target="hopper")(f.fn)  # noqa: E731
    out = []
    for bm, bn, bk, st, th in ((64, 64, 64, 8, 128), (64, 128, 64, 6, 128), (64, 256, 64, 4, 128),
                               (128, 128, 64, 4, 128), (128, 256, 64, 3, 256)):
        out.append((f"tiled {bm}x{bn}x{bk} s{st} t{th}",
                    lambda bm=bm, bn=bn, bk=bk, st=st, th=th: hop(g.tiled)(
                        Mv, N, K, block_M=bm, block_N=bn, block_K=bk, num_stages=st, threads=th, swizzle=8)))
    out.append(("persistent 128x256x64 s3", lambda: hop(g.persistent)(Mv, N, K, num_sms=tilews.num_sms())))
    for bm, bn, splits in SPLITS:
        def build(bm=bm, bn=bn, splits=splits):
            part = hop(g.split_k)(Mv, N, K, splits=splits, block_M=bm, block_N=bn, block_K=64,
                                  num_stages=6 if bm == 64 else 4)
            red = tilews.jit(out_idx=[-1], target="hopper")(g.split_k_reduce.fn)(Mv, N, splits, g.split_width(N, bn))
            return lambda a, b: red(part(a, b))
        out.append((f"split_k {bm}x{bn}x64 x{splits}", build))
    for bn, bm in ((128, 16), (128, 32), (64, 16), (128, 64)):
        out.append((f"swap_ab {bn}x{bm}x64", lambda bn=bn, bm=bm: hop(g.swap_ab)(
            Mv, N, K, block_N=bn, block_M=bm, block_K=64, num_stages=6)))
    return out


def cold_ms(fn, a, b):
    """Median ms of ``fn(a', b')`` as ``tilews-bench`` times it (L2 flushed, input sets rotated)."""
    from tilews.bench import timing
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    n = timing.sets_needed(a.nbytes + b.nbytes + a.shape[0] * b.shape[1] * 2, l2)
    sets = [(a, b)] + [(a.clone(), b.clone()) for _ in range(n - 1)]
    return timing.median_ms(fn, sets, a.device, quick=False)


def graph_ms(fn, a, b, reps=3, inner=20):
    """Median ms per call of ``fn(a, b)`` replayed from a CUDA graph of ``inner`` calls."""
    fn = (lambda f: lambda: f(a, b))(fn)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--small", action="store_true", help="the shapes where split-K matters, more splits")
    ap.add_argument("--narrow", action="store_true", help="M = 1..128 at two LLM N, K; more splits")
    ap.add_argument("--cold", action="store_true", help="time as tilews-bench does (L2 flushed)")
    args = ap.parse_args()
    global SPLITS, LLM_M, LLM_NK, RAGGED, SQUARE
    if args.small:
        SPLITS, LLM_M, RAGGED, SQUARE = SMALL_SPLITS, (1, 16, 32, 128, 512), RAGGED[:3], ()
    if args.narrow:
        SPLITS, LLM_M, LLM_NK, RAGGED, SQUARE = SMALL_SPLITS, (1, 16, 32, 128), LLM_NK[::2], (), ()
    timer = cold_ms if args.cold else graph_ms
    t0 = time.time()
    groups = [((N, K), None, [(M, N, K) for M in LLM_M]) for N, K in LLM_NK]
    groups += [((N, K), M, [(M, N, K)]) for M, N, K in RAGGED + SQUARE]
    if args.quick:
        groups = groups[:1]
    # compile everything first (each Gluon compile is a child process: threads overlap them)
    jobs = [(gi, name, build) for gi, ((N, K), M, _) in enumerate(groups) for name, build in candidates(N, K, M)]
    built = {}

    def make(job):
        gi, name, build = job
        try:
            return gi, name, build()
        except Exception as e:      # a schedule that does not compile for this shape: reported
            return gi, name, e
    first, rest = jobs[0], jobs[1:]
    results = [make(first)] + list(ThreadPoolExecutor(12).map(make, rest))
    for gi, name, k in results:
        built.setdefault(gi, []).append((name, k))
    print(f"compiled {len(jobs)} schedules in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for gi, ((N, K), M0, shapes) in enumerate(groups):
        for (M, N, K) in shapes:
            if time.time() - t0 > 540:
                print("time limit: stopping")
                break
            a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
            ref = (a.float() @ b.float())
            live = []
            for name, k in built[gi]:
                if isinstance(k, Exception):
                    rows.append(dict(shape=[M, N, K], name=name, error=f"{type(k).__name__}: {str(k)[:200]}"))
                    continue
                try:
                    out = k(a, b)
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        rows.append(dict(shape=[M, N, K], name=name, error=f"rel err {err}"))
                        continue
                    live.append((name, k))
                except Exception as e:
                    rows.append(dict(shape=[M, N, K], name=name, error=f"{type(e).__name__}: {str(e)[:300]}"))
            ratios = {name: [] for name, _ in live}
            for _ in range(3):
                for name, k in live:
                    t_ref = timer(torch.matmul, a, b)
                    t = timer(k, a, b)
                    ratios[name].append((t_ref / t, t, t_ref))
            for name, r in ratios.items():
                rows.append(dict(shape=[M, N, K], name=name, ratio=statistics.median(x[0] for x in r),
                                 spread=[min(x[0] for x in r), max(x[0] for x in r)],
                                 ms=statistics.median(x[1] for x in r), ref_ms=statistics.median(x[2] for x in r)))
            best = max((x for x in rows if x["shape"] == [M, N, K] and "ratio" in x), key=lambda x: x["ratio"], default=None)
            if best:
                print(f"{M}x{N}x{K}: best {best['name']} {best['ratio']:.2f}x (cuBLAS {best['ref_ms']*1e3:.1f} us)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("| shape | schedule | ratio to torch.matmul | spread | us | cuBLAS us |")
    for r in rows:
        if "ratio" in r:
            print(f"| {'x'.join(map(str, r['shape']))} | {r['name']} | {r['ratio']:.3f} | {r['spread'][0]:.2f}-{r['spread'][1]:.2f} | {r['ms']*1e3:.1f} | {r['ref_ms']*1e3:.1f} |")
        else:
            print(f"| {'x'.join(map(str, r['shape']))} | {r['name']} | ERROR {r['error']} |")


if __name__ == "__main__":
    main()
