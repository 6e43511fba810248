"""GPU time of ``tilews.ops.fp8_scaled_mm`` with per-tensor scales against ``torch._scaled_mm`` at
decode shapes, without the host: each side replayed from a CUDA graph of 10 passes over enough
input sets to pass L2 (>= 160 MB of B), in rounds alternating which goes first; prints per shape
the median time per call and the median ratio (cuBLAS time / ours: >1 is faster) with its range.

    TILEWS_DEVICE_CMD='python scripts/probe_fp8_graph_time.py' bash scripts/device_run.sh
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from peer_compare import capture_graph, launches_ms
from tilews.ops import fp8_scaled_mm

DECODE = [(m, n, k) for m in (16, 32, 64, 128) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]


def input_sets(m: int, n: int, k: int) -> list[tuple]:
    """(a, b, scale_a, scale_b) sets, b column-major (what ``_scaled_mm`` takes), >= 160 MB of b."""
    def fp8(*shape):
        return (torch.randn(*shape, device="cuda") / 2).to(torch.float8_e4m3fn)
    sets = max(2, -(-160 * 2**20 // (n * k)))
    return [(fp8(m, k), fp8(n, k).t(), torch.tensor(0.7, device="cuda"), torch.tensor(1.3, device="cuda"))
            for _ in range(sets)]


def time_shape(m: int, n: int, k: int, rounds: int) -> dict:
    sets = input_sets(m, n, k)
    want = torch._scaled_mm(*sets[0], out_dtype=torch.bfloat16).float()
    got = fp8_scaled_mm(*sets[0], out_dtype=torch.bfloat16).float()
    err = float((got - want).abs().max() / want.abs().max())
    if err > 1e-2:
        raise AssertionError(f"{m}x{n}x{k}: relative error {err:.2e} against torch._scaled_mm")
    graphs = {"ours": capture_graph(lambda: [fp8_scaled_mm(*s, out_dtype=torch.bfloat16) for s in sets], 10),
              "cublas": capture_graph(lambda: [torch._scaled_mm(*s, out_dtype=torch.bfloat16) for s in sets], 10)}
    us = {name: [] for name in graphs}
    for r in range(rounds):
        for name in (("ours", "cublas") if r % 2 == 0 else ("cublas", "ours")):
            us[name].append(launches_ms(graphs[name].replay, 20.0) / (10 * len(sets)) * 1000)
    ratios = [c / o for o, c in zip(us["ours"], us["cublas"])]
    return dict(ours_us=statistics.median(us["ours"]), cublas_us=statistics.median(us["cublas"]),
                ratio=statistics.median(ratios), lo=min(ratios), hi=max(ratios), rel_err=err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", help="comma list of MxNxK (default: M 16/32/64/128 x 4096x4096, "
                                     "14336x4096, 4096x14336)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tag", default="", help="a word put before each line (ab_trees.sh: base / new)")
    ap.add_argument("--json")
    args = ap.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes else DECODE
    results = {}
    for m, n, k in shapes:
        r = results[f"{m}x{n}x{k}"] = time_shape(m, n, k, args.rounds)
        print(f"{args.tag} {m}x{n}x{k}: ours {r['ours_us']:.2f} us, cuBLAS {r['cublas_us']:.2f} us, "
              f"speed {r['ratio']:.3f}x ({r['lo']:.3f}..{r['hi']:.3f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
