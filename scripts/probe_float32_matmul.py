"""Probe: ``tilews.ops.matmul`` on float32 operands against ``torch.matmul``, both with TF32
(``torch.backends.cuda.matmul.allow_tf32 = True``) and exact (False), at LLM-like shapes.

Each (shape, mode) is checked against the float64 product (outputs poisoned first: the op
allocates them, so the check reads every element it wrote) and timed as ``tilews-bench`` times
(``tilews.testing.time_ms``: CUDA events, ``do_bench``'s median), the two contenders interleaved
over ``--rounds`` rounds; the table gives the median ratio torch / tilews (> 1: tilews faster) and
its min..max over the rounds, and each one's relative error, and the schedule the op ran.
``--tune`` runs ``tilews.ops.tune`` on each (shape, mode) first (the op then runs the winner of
its tuning space instead of the heuristic's guess); ``--schedules 'TEXT;TEXT'`` times those
schedules too (``tilews.ops.run``, one row each, e.g. 'tiled 128x128x32 s4 t256'). ``--json``
writes the rows.

    python scripts/probe_float32_matmul.py [--rounds N] [--shapes MxNxK,...] [--tune]
                                           [--schedules 'TEXT;...'] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import tilews
from tilews.ops.schedule import Schedule
from tilews.testing import rel_err, time_ms


def _compare(ours, theirs, exact, rounds: int, dev) -> dict:
    """Relative errors against ``exact``; ms and the ratio theirs / ours over interleaved rounds."""
    errs = (rel_err(ours(), exact), rel_err(theirs(), exact))
    ratios = []
    for r in range(rounds):
        pair = [("tilews", ours), ("torch", theirs)]
        t = {name: time_ms(fn, dev) for name, fn in (pair if r % 2 == 0 else pair[::-1])}
        ratios.append((t["torch"] / t["tilews"], t["tilews"], t["torch"]))
    return dict(err_tilews=errs[0], err_torch=errs[1], ratio=statistics.median(x[0] for x in ratios),
                ratio_min=min(x[0] for x in ratios), ratio_max=max(x[0] for x in ratios),
                ms_tilews=statistics.median(x[1] for x in ratios),
                ms_torch=statistics.median(x[2] for x in ratios))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shapes", default="4096x4096x4096,1024x4096x4096,16x4096x4096,1000x1100x1234")
    p.add_argument("--tune", action="store_true")
    p.add_argument("--schedules", default="")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = []
    for text in args.shapes.split(","):
        M, N, K = (int(v) for v in text.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn(M, K, device=dev, generator=g)
        b = torch.randn(K, N, device=dev, generator=g)
        exact = a.double() @ b.double()
        for tf32 in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            if args.tune:
                tilews.ops.tune(a, b)
            chosen = [(str(tilews.ops.matmul_schedule(a, b)), lambda: tilews.ops.matmul(a, b))]
            chosen += [(text, lambda s=Schedule.from_text(text): tilews.ops.run(a, b, None, s))
                       for text in filter(None, args.schedules.split(";"))]
            for schedule, ours in chosen:
                try:
                    found = _compare(ours, lambda: torch.matmul(a, b), exact, args.rounds, dev)
                except Exception as e:   # a schedule that does not fit is reported, not fatal
                    print(f"{text} {schedule}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                    continue
                rows.append(dict(shape=text, mode="tf32" if tf32 else "ieee", schedule=schedule, **found))
                print(rows[-1], flush=True)
    print("\n| shape | mode | schedule | tilews ms | torch ms | torch/tilews (min..max) | err tilews | err torch |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['mode']} | {r['schedule']} | {r['ms_tilews']:.4f} | {r['ms_torch']:.4f} | "
              f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}..{r['ratio_max']:.2f}) | {r['err_tilews']:.1e} | "
              f"{r['err_torch']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
