"""``python -m tilews.bench.compile_workers [--space gemm|attention] [--target T] [--rounds N]
[--workers N]``: seconds to
compile an autotuning space one configuration after the other, in ``--workers`` threads (default:
the CPU count) and in that many forked processes (``TILEWS_COMPILE_PROCESSES``), as the autotuner
compiles it (``tilews.jit.compile_each``).

The space (``--space``): six ``examples/gemm.py`` configurations (block sizes, stages, threads)
of a 1024x1024x1024 fp16 GEMM (``gemm``, the default), or four of the flash-attention forward
``tilews.ops.attention.mha_fwd_program`` at D128, causal (``attention``: builds of seconds each),
for ``--target`` (default ``hopper``: compile-only without a GPU; nothing is launched). Each round compiles the space in each mode, in rotating order, each
from cold caches: a new jit function (its memo empty), a new empty tilews cache folder (the
processes hand their builds over through it) and Triton's cache folder emptied. All must give the
same kernels (their generated sources and, where built, PTX): else exit code 1. Prints each
mode's median over the rounds and its speed-up over serial.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

GEMM_SPACE = [dict(block_M=128, block_N=bn, block_K=bk, num_stages=stages, threads=threads)
              for bn, bk, stages, threads in [(128, 32, 3, 128), (128, 64, 2, 256), (256, 64, 3, 256),
                                              (64, 32, 4, 128), (128, 64, 4, 256), (256, 32, 2, 256)]]
# flash-attention forward (D128, causal) configurations: builds of ~3-5 s each, where a process
# per build is meant to pay
ATTENTION_SPACE = [dict(block_M=bm, block_N=bn, num_stages=stages, threads=threads)
                   for bm, bn, stages, threads in [(128, 128, 2, 256), (128, 64, 2, 256),
                                                   (128, 64, 3, 256), (64, 64, 2, 128)]]
SPACES = {"gemm": GEMM_SPACE, "attention": ATTENTION_SPACE}


def compile_space(space: str, target: str, workers: int, processes: bool,
                  caches: tuple[str, str]) -> tuple[float, list]:
    """(seconds, the kernels) of one cold compile of the space; ``caches``: Triton's and tilews's
    cache folders (emptied first: the same paths each time, as the PTX names the source file)."""
    import tilews
    import tilews.language as T
    from examples.gemm import matmul
    from tilews.jit import compile_each
    from tilews.ops.attention import mha_fwd_program
    for folder in caches:
        for entry in os.listdir(folder):
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)
    os.environ.update(TILEWS_CACHE_DIR=caches[1], TILEWS_COMPILE_PROCESSES="1" if processes else "0")
    if space == "gemm":
        fn = tilews.jit(out_idx=[-1], target=target)(matmul.fn)
        build = lambda config: fn.compile(1024, 1024, 1024, **config)    # noqa: E731
    else:
        fn = tilews.jit(out_idx=[3], target=target)(mha_fwd_program)
        build = lambda config: fn.compile(4, 16, 4096, 128, True, dtype=T.float16, **config)  # noqa: E731
    start = time.perf_counter()
    kernels = compile_each(SPACES[space], build, workers)
    seconds = time.perf_counter() - start
    return seconds, [(k.target, k.get_kernel_source(), k.asm.get("ptx")) for k in kernels]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="hopper")
    parser.add_argument("--space", choices=sorted(SPACES), default="gemm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    # Triton reads its cache folder when first imported: set it before anything imports Triton
    caches = (tempfile.mkdtemp(prefix="tilews-bench-triton-"),
              tempfile.mkdtemp(prefix="tilews-bench-cache-"))
    os.environ["TRITON_CACHE_DIR"] = caches[0]
    from tilews.jit import ast_is_thread_safe
    if not ast_is_thread_safe():
        print(f"Python {sys.version.split()[0]}: ast is not thread-safe, so compile_each's threads "
              f"compile one after the other whatever the worker count")
    compile_space(args.space, args.target, 1, False, caches)   # imports, first compiles: not timed
    modes = {"serial": (1, False), f"{args.workers} threads": (args.workers, False),
             f"{args.workers} processes": (args.workers, True)}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    kernels = {}
    for round_ in range(args.rounds):
        names = list(modes)[round_ % len(modes):] + list(modes)[:round_ % len(modes)]
        for mode in names:
            seconds, kernels[mode] = compile_space(args.space, args.target, *modes[mode], caches)
            times[mode].append(seconds)
        differ = [mode for mode, k in kernels.items() if k != kernels["serial"]]
        if differ:
            print(f"{', '.join(differ)}: other kernels than serial", file=sys.stderr)
            return 1
    serial = statistics.median(times["serial"])
    print(f"{len(SPACES[args.space])} {args.space} configurations for '{args.target}' ({kernels['serial'][0][0]}), "
          f"{args.rounds} rounds, cold caches")
    for mode, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {mode:>13}: median {median:.2f} s  {['%.2f' % t for t in seconds]}  "
              f"speed-up {serial / median:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
