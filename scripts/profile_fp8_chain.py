"""Where the time goes when FP8 decode GEMMs run back to back (issue 41 item 4): the graphs of
``probe_fp8_graph_time.py`` (10 passes over input sets holding >= 160 MB of b, per-tensor
scales, bf16 out), ``tilews.ops.fp8_scaled_mm`` and ``torch._scaled_mm`` each replayed under
``torch.profiler``, in rounds alternating which goes first. Per side: the graph's time per call,
each kernel's own duration (median, and its first and last deciles), and the step from one
kernel's start to the next one's (its duration plus the gap, negative where a programmatic
dependent launch overlaps the two), with the kernel's name; then the same kernels launched one at
a time (a synchronize and an L2 flush before each), so the chain's cost is split into the
kernels' own time and what running back to back adds or hides.

    TILEWS_DEVICE_CMD='python scripts/profile_fp8_chain.py --shapes 128x4096x14336,64x4096x14336' bash scripts/device_run.sh
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from peer_compare import capture_graph
from probe_fp8_graph_time import BF16, input_sets, shape_list
from tilews.ops import fp8_scaled_mm

SIDES = {"ours": lambda s: fp8_scaled_mm(*s, out_dtype=BF16),
         "cublas": lambda s: torch._scaled_mm(*s, out_dtype=BF16)}


def kernels(run) -> list:
    """The CUDA kernels ``run`` launches, in start order: (name, start us, duration us)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    got = [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
           if e.device_type.name == "CUDA" and "memset" not in e.name.lower()
           and "memcpy" not in e.name.lower()]
    return sorted(got, key=lambda k: k[1])


def decile(values: list, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def chain(shape: tuple, rounds: int) -> dict:
    sets = input_sets(*shape)
    graphs = {side: capture_graph(lambda side=side: [SIDES[side](s) for s in sets], 10)
              for side in SIDES}
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    got = {side: {"graph_us": [], "kernel_us": [], "step_us": [], "alone_us": [], "names": set()}
           for side in SIDES}
    for r in range(rounds):
        for side in (SIDES if r % 2 == 0 else reversed(list(SIDES))):
            row = got[side]
            ks = kernels(graphs[side].replay)
            row["names"].update(k[0][:90] for k in ks)
            row["graph_us"].append((ks[-1][1] + ks[-1][2] - ks[0][1]) / (10 * len(sets)))
            row["kernel_us"] += [k[2] for k in ks]
            row["step_us"] += [b[1] - a[1] for a, b in zip(ks, ks[1:])]

            def alone(side=side):
                for s in sets:
                    flush.zero_()
                    torch.cuda.synchronize()
                    SIDES[side](s)
                    torch.cuda.synchronize()
            row["alone_us"] += [k[2] for k in kernels(alone) if "zero" not in k[0].lower()
                                and "fill" not in k[0].lower() and "elementwise" not in k[0].lower()]
    out = {}
    for side, row in got.items():
        out[side] = {"graph_us_per_call": statistics.median(row["graph_us"]),
                     "kernel_us": statistics.median(row["kernel_us"]),
                     "kernel_p10_p90": (decile(row["kernel_us"], 0.1), decile(row["kernel_us"], 0.9)),
                     "step_us": statistics.median(row["step_us"]),
                     "alone_us": statistics.median(row["alone_us"]) if row["alone_us"] else None,
                     "kernels_per_call": len(row["kernel_us"]) / (rounds * 10 * len(sets)),
                     "names": sorted(row["names"])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x4096x14336")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {}
    for shape in shape_list(args.shapes):
        name = "x".join(map(str, shape))
        results[name] = res = chain(shape, args.rounds)
        print(f"\n{name} (FP8 e4m3, per-tensor scales, bf16 out), {args.rounds} rounds")
        for side, r in res.items():
            print(f"  {side:<7} graph {r['graph_us_per_call']:7.2f} us/call  kernel {r['kernel_us']:7.2f} us "
                  f"(p10 {r['kernel_p10_p90'][0]:.2f}, p90 {r['kernel_p10_p90'][1]:.2f})  start-to-start "
                  f"{r['step_us']:7.2f} us  alone {r['alone_us'] or float('nan'):7.2f} us  "
                  f"{r['kernels_per_call']:.2f} kernels/call  {r['names']}")
        o, c = res["ours"], res["cublas"]
        print(f"  cuBLAS / ours: graph {c['graph_us_per_call'] / o['graph_us_per_call']:.3f}, kernel "
              f"{c['kernel_us'] / o['kernel_us']:.3f}, alone {(c['alone_us'] or 0) / (o['alone_us'] or 1):.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=list)


if __name__ == "__main__":
    main()
