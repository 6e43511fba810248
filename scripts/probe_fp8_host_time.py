"""Host microseconds per cached ``tilews.ops.fp8_scaled_mm`` call on a GPU, against
``torch._scaled_mm`` on the same inputs: per shape, ``--calls`` back-to-back calls after a
synchronize, timed by the wall clock until the last returns (the GPU's queue absorbs them, so
this is the host's cost wherever it outlasts the kernel), the two sides alternating which goes
first; the median over ``--rounds`` rounds and the spread. Shapes: the launch bench's (64x64x64,
per-row / per-column scales) and a decode GEMM with per-tensor scales (16x4096x4096, which the op
runs swapped, C^T = B A^T). b is column-major (``w.t()``) as torch passes a weight.

    TILEWS_DEVICE_CMD='python scripts/probe_fp8_host_time.py' bash scripts/device_run.sh

Before / after in one GPU run (``.base``: the older tree, see scripts/ab_trees.sh), the
processes' medians summed up last (``--summary``: per tree and shape, the median over its runs):
    TILEWS_DEVICE_CMD="bash scripts/ab_trees.sh 2 'python {root}/scripts/probe_fp8_host_time.py
    --tag {which} --json \\$OUT/host_{which}_{r}.json'; python scripts/probe_fp8_host_time.py
    --summary \\$OUT/host_*.json" bash scripts/device_run.sh
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from tilews.ops import fp8_scaled_mm

SHAPES = {"64x64x64 rowwise": (64, 64, 64, "row"), "16x4096x4096 tensorwise": (16, 4096, 4096, "tensor")}


def inputs(m: int, n: int, k: int, scaling: str) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(m, k, generator=g, device="cuda") / 2).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g, device="cuda") / 2).to(torch.float8_e4m3fn).t()
    if scaling == "row":
        return a, b, torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    return a, b, torch.tensor(0.7, device="cuda"), torch.tensor(1.3, device="cuda")


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def time_shape(args: tuple, calls: int, rounds: int) -> dict:
    sides = {"fp8_scaled_mm": lambda: fp8_scaled_mm(*args, out_dtype=torch.bfloat16),
             "torch._scaled_mm": lambda: torch._scaled_mm(*args, out_dtype=torch.bfloat16)}
    want, got = (fn().float() for fn in sides.values())
    err = float((got - want).abs().max() / want.abs().max())
    if err > 1e-2:
        raise AssertionError(f"relative error {err:.2e} against torch._scaled_mm")
    for fn in sides.values():
        per_call_us(fn, calls)                          # warm
    us = {name: [] for name in sides}
    for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            us[name].append(per_call_us(sides[name], calls))
    return {name: {"us": statistics.median(v), "spread_pct": (max(v) - min(v)) / statistics.median(v) * 100,
                   "us_runs": v} for name, v in us.items()} | {"rel_err": err}


def summary(paths: list[str]) -> None:
    """Per shape and tree (the runs' tags), the median of the runs' per-call medians."""
    runs = [json.load(open(p)) for p in paths]
    tags = sorted({r["tag"] for r in runs})
    print(f"{len(runs)} runs on {runs[0]['device']}: host us per call, median over each tree's runs")
    print(f"{'shape':24s} " + " ".join(f"{t + ' fp8_scaled_mm':>20s}" for t in tags) + f" {'torch._scaled_mm':>17s}")
    for shape in runs[0]["results"]:
        ours = [statistics.median(r["results"][shape]["fp8_scaled_mm"]["us"] for r in runs if r["tag"] == t)
                for t in tags]
        theirs = statistics.median(r["results"][shape]["torch._scaled_mm"]["us"] for r in runs)
        print(f"{shape:24s} " + " ".join(f"{u:20.1f}" for u in ours) + f" {theirs:17.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tag", default="", help="a word put before each row (ab_trees.sh: base / new)")
    ap.add_argument("--json")
    ap.add_argument("--summary", nargs="+", metavar="JSON", help="only sum up these runs' files")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary)
        return
    results = {name: time_shape(inputs(*shape), args.calls, args.rounds) for name, shape in SHAPES.items()}
    data = {"device": torch.cuda.get_device_name(), "tag": args.tag, "calls": args.calls,
            "rounds": args.rounds, "results": results}
    path = args.json or (os.path.join(os.environ["OUT"], f"fp8_host{'_' + args.tag if args.tag else ''}.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
    print(f"{'tree':5s} {'shape':24s} {'fp8_scaled_mm us':>17s} {'torch._scaled_mm us':>20s} {'minus torch':>12s}")
    for name, r in results.items():
        ours, torchs = r["fp8_scaled_mm"], r["torch._scaled_mm"]
        print(f"{args.tag:5s} {name:24s} {ours['us']:9.1f} ±{ours['spread_pct']:3.0f}% "
              f"{torchs['us']:12.1f} ±{torchs['spread_pct']:3.0f}% {ours['us'] - torchs['us']:+12.1f}")


if __name__ == "__main__":
    main()
