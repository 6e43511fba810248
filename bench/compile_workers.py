"""``python -m tilews.bench.compile_workers [--target T] [--rounds N] [--workers N]``: seconds to
compile an autotuning space one configuration after the other and in ``--workers`` threads
(default: the CPU count), as the autotuner compiles it (``tilews.jit.compile_each``).

The space: six ``examples/gemm.py`` configurations (block sizes, stages, threads) of a
1024x1024x1024 fp16 GEMM for ``--target`` (default ``hopper``: compile-only without a GPU; nothing
is launched). Each round compiles the space serially and in threads, in alternating order, each
from cold caches: a new jit function (its memo empty), tilews's disk cache off
(``tilews.env.disable_cache()``) and Triton's cache folder emptied. Both must give the same
kernels (their generated sources and, where built, PTX): else exit code 1. Prints each mode's
median over the rounds and the speed-up serial / threads.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

SPACE = [dict(block_M=128, block_N=bn, block_K=bk, num_stages=stages, threads=threads)
         for bn, bk, stages, threads in [(128, 32, 3, 128), (128, 64, 2, 256), (256, 64, 3, 256),
                                         (64, 32, 4, 128), (128, 64, 4, 256), (256, 32, 2, 256)]]


def compile_space(target: str, workers: int, triton_cache: str) -> tuple[float, list]:
    import tilews
    from examples.gemm import matmul
    from tilews.jit import compile_each
    for entry in os.listdir(triton_cache):
        shutil.rmtree(os.path.join(triton_cache, entry), ignore_errors=True)
    fn = tilews.jit(out_idx=[-1], target=target)(matmul.fn)
    start = time.perf_counter()
    kernels = compile_each(SPACE, lambda config: fn.compile(1024, 1024, 1024, **config), workers)
    seconds = time.perf_counter() - start
    return seconds, [(k.target, k.get_kernel_source(), k.asm.get("ptx")) for k in kernels]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="hopper")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    # Triton reads its cache folder when first imported: set it before anything imports Triton
    triton_cache = tempfile.mkdtemp(prefix="tilews-bench-triton-")
    os.environ["TRITON_CACHE_DIR"] = triton_cache
    from tilews.env import env
    from tilews.jit import ast_is_thread_safe
    env.disable_cache()
    if not ast_is_thread_safe():
        print(f"Python {sys.version.split()[0]}: ast is not thread-safe, so compile_each compiles "
              f"one after the other whatever the worker count")
    compile_space(args.target, 1, triton_cache)       # imports and first compiles, not timed
    times: dict[int, list[float]] = {1: [], args.workers: []}
    kernels = {}
    for round_ in range(args.rounds):
        order = [1, args.workers] if round_ % 2 == 0 else [args.workers, 1]
        for workers in order:
            seconds, kernels[workers] = compile_space(args.target, workers, triton_cache)
            times[workers].append(seconds)
        if kernels[1] != kernels[args.workers]:
            print("serial and threaded compiles gave different kernels", file=sys.stderr)
            return 1
    serial, threads = (statistics.median(times[w]) for w in (1, args.workers))
    print(f"{len(SPACE)} gemm configurations for '{args.target}' ({kernels[1][0][0]}), "
          f"{args.rounds} rounds, cold caches")
    print(f"  serial:            median {serial:.2f} s  {['%.2f' % t for t in times[1]]}")
    print(f"  {args.workers:>2} threads:        median {threads:.2f} s  "
          f"{['%.2f' % t for t in times[args.workers]]}")
    print(f"  speed-up: {serial / threads:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
