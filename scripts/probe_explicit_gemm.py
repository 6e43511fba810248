"""The seed's explicit warp-specialized GEMM (``examples/ws_gemm.py``'s ``ws_matmul_program``: one
handshake, merged ``T.ws(1, 2)`` consumers, 128x128x32 as its user wrote it) at 8192^3 bf16 with
and without the passes that act on it (``coarsen_handshakes``: two k tiles per hand-over;
``panel_grid``: tiles in panels of 16 rows), beside the ring form and cuBLAS, timed in
interleaved rounds in one process on one GPU.

    python scripts/probe_explicit_gemm.py [--rounds 5] [--size 8192]

A variant without a pass is lowered by the Gluon pipeline less that pass (only while it
compiles; the disk cache is off, its key does not see the patch). Every variant is checked
against a float32 product (rel err < 1e-2) before timing; each round times every variant then
``torch.matmul`` (``triton.testing.do_bench``: CUDA events, L2 flushed). The table gives each
one's median ms and TFLOP/s and the median over the rounds of cuBLAS's time / the variant's
(> 1: faster than cuBLAS), min..max.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys

os.environ["TILEWS_DISABLE_CACHE"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import tilews  # noqa: E402
import tilews.language as T  # noqa: E402
from examples.ws_gemm import ws_matmul_program, ws_ring_matmul_program  # noqa: E402
from tilews.triton_ext.gluon.backend import GluonBackend  # noqa: E402


@contextlib.contextmanager
def without(*names):
    whole = GluonBackend.pipeline
    pipeline = whole
    for name in names:
        pipeline = pipeline.without(name)
    GluonBackend.pipeline = pipeline
    try:
        yield
    finally:
        GluonBackend.pipeline = whole


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=8192)
    opts = ap.parse_args()
    n = opts.size
    seed = (ws_matmul_program, dict(dtype=T.bfloat16))
    variants = [
        ("one handshake 128x128x32 (now: coarsen + panels)", seed, ()),
        ("  without coarsen_handshakes", seed, ("coarsen_handshakes",)),
        ("  without panel_grid", seed, ("panel_grid",)),
        ("  without both (before)", seed, ("coarsen_handshakes", "panel_grid")),
        ("ring 128x256x64 s3 (user's T.use_swizzle(8))", (ws_ring_matmul_program, {}), ()),
    ]
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16)
    ref = a.float() @ b.float()
    live = {}
    for label, (program, kw), off in variants:
        with without(*off):
            kernel = tilews.jit(out_idx=[-1], target="hopper")(program)(n, n, n, **kw)
            out = kernel(a, b)
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        notes = [x.split(":")[0] for x in kernel.report.notes
                 if x.split(":")[0] in ("coarsen_handshakes", "ring_handshakes", "panel_grid")]
        print(f"{label}: rel err {err:.2e}; notes from {', '.join(notes) or 'none'}", flush=True)
        if err < 1e-2:
            live[label] = kernel
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731
    times = {label: [] for label in live}
    for r in range(opts.rounds):
        for label, kernel in live.items():
            mine = bench(lambda: kernel(a, b))
            theirs = bench(lambda: torch.matmul(a, b))
            times[label].append((mine, theirs / mine))
        print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr, flush=True)
    flops = 2 * n ** 3
    print(f"\n{torch.cuda.get_device_name()} · {n}^3 bf16 · {opts.rounds} interleaved rounds")
    print("| variant | ms | TFLOP/s | cuBLAS time / variant's (min..max) |")
    print("|---|---|---|---|")
    for label, rows in times.items():
        ms = statistics.median(t for t, _ in rows)
        ratios = [x for _, x in rows]
        print(f"| {label} | {ms:.3f} | {flops / ms / 1e9:.1f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}..{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
