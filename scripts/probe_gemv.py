"""GEMV on the GPU: TileLang's thread-level GEMV (``gemv/example_gemv.py``,
``splitk_gemv_vectorized_tvm``) built by tilews and by TileLang 0.1.15, with ``torch.mv``:
where tilews's time goes. Prints TileLang's CUDA source, tilews's Triton source, a profile of
tilews's host-side call, and CUDA-graph times of tl spellings of the serial K loop (``range``,
``tl.range`` unrolled, ``tl.range`` with ``num_stages``), interleaved with TileLang and torch.

    python scripts/probe_gemv.py [--n 14336] [--k 4096] [--rounds 5]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from peer_compare import graph_ms, launches_ms, load, unpack_peers  # noqa: E402


def spelled_loops(head: str):
    """The tl emitter with serial loops of build-time bounds spelled ``head`` (a format of
    ``bounds``)."""
    import importlib
    from tilews.lowering import ir
    emit = importlib.import_module("tilews.triton_ext.tl.emit")
    original = emit._for

    def variant(ctx, s):
        if s.kind is ir.ForKind.SERIAL and all(ir.as_int(x) is not None for x in (s.start, s.stop, s.step)):
            bounds = ", ".join(str(ir.as_int(x)) for x in (s.start, s.stop, s.step))
            var = ctx.name(s.var.name)
            ctx.nonneg.add(s.var)
            ctx.line(f"for {var} in {head.format(bounds=bounds)}:")
            with ctx.indent():
                emit.stmt(ctx, s.body)
            return
        original(ctx, s)
    return variant


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    import torch
    unpack_peers()
    n, k = opts.n, opts.k
    cfg = dict(N=n, K=k, BLOCK_N=2, reduce_threads=32)
    tl_mod = load("original", "gemv", "example_gemv.py")
    tl_kernel = tl_mod.splitk_gemv_vectorized_tvm.compile(**cfg)
    print("=== TileLang CUDA source\n", tl_kernel.get_kernel_source()[-1500:])
    a = torch.randn(k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ref = b.float() @ a.float()

    os.environ["TILEWS_DISABLE_CACHE"] = "1"
    import importlib
    from tilews.lowering import ir
    emit = importlib.import_module("tilews.triton_ext.tl.emit")
    variants = {"range": None, "unroll2": "tl.range({bounds}, loop_unroll_factor=2)",
                "unroll4": "tl.range({bounds}, loop_unroll_factor=4)",
                "stages2": "tl.range({bounds}, num_stages=2)",
                "stages3": "tl.range({bounds}, num_stages=3)",
                "static": "tl.static_range({bounds})"}
    original = emit._for
    kernels = {}
    for name, head in variants.items():
        emit._STMTS[ir.For] = original if head is None else spelled_loops(head)
        try:
            mod = load("tilews", "gemv", "example_gemv.py")
            kern = mod.splitk_gemv_vectorized_tvm.compile(**cfg)
            out = kern(a, b)
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            kernels[name] = kern
            ptx = kern.asm.get("ptx", "")
            print(f"--- {name}: rel err {err:.1e}; ld.global.v4 {ptx.count('ld.global.v4')}, "
                  f"ld.global {ptx.count('ld.global')}")
            if name == "range":
                print(kern.get_kernel_source())
        except Exception as e:          # noqa: BLE001
            print(f"--- {name}: {type(e).__name__}: {str(e)[:300]}")
    emit._STMTS[ir.For] = original

    base = kernels["range"]
    bound = base.bound([a, b])
    prof = cProfile.Profile()
    for _ in range(200):
        base(a, b)
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(3000):
        base(a, b)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)

    runs = {f"tilews_{name}": (lambda kk=kk: kk(a, b)) for name, kk in kernels.items()}
    runs["tilews_bound"] = lambda: bound(a, b)
    runs["tilelang"] = lambda: tl_kernel(a, b)
    runs["torch"] = lambda: torch.mv(b, a)
    for timer in (graph_ms, launches_ms):
        times = {name: [] for name in runs}
        for _ in range(opts.rounds):
            for name, fn in runs.items():
                times[name].append(timer(fn))
        print(f"\n{timer.__name__} (median of {opts.rounds} rounds, us): " + ", ".join(
            f"{name} {statistics.median(ts) * 1e3:.2f}" for name, ts in times.items()))


if __name__ == "__main__":
    main()
