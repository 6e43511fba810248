"""GPU time of ``tilews.ops.fp8_scaled_mm`` with per-tensor scales against ``torch._scaled_mm`` at
decode shapes, without the host: each side replayed from a CUDA graph of 10 passes over enough
input sets to pass L2 (>= 160 MB of B), in rounds alternating which goes first; prints per shape
the median time per call and the median ratio (cuBLAS time / ours: >1 is faster) with its range.

    TILEWS_DEVICE_CMD='python scripts/probe_fp8_graph_time.py' bash scripts/device_run.sh

``--chains``: at these shapes also a chain of two different kernels per call, the second reading
the first's result (y = a1 b1, then a2 b2 + y's first row as the bias, ``_scaled_mm``'s bias on
the cuBLAS side), timed the same way per chain; the last pass of a replayed graph is checked
against float64 (a kernel that read its input before the previous one wrote it, or wrote over
what the previous one still read, fails it). ``--table DIR``: the before / after table of
``scripts/ab_trees.sh``'s JSON files ``DIR/g_{base,new}_{round}.json`` (medians over rounds).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

from peer_compare import capture_graph, launches_ms
from tilews.bench.fp8 import exact
from tilews.ops import fp8_scaled_mm

DECODE = [(m, n, k) for m in (16, 32, 64, 128) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
BF16 = torch.bfloat16


def operands(m: int, n: int, k: int) -> tuple:
    """(a, b, scale_a, scale_b): random e4m3 a [m, k] and b [k, n] column-major (``w.t()``, what
    ``_scaled_mm`` takes), per-tensor scales."""
    def fp8(*shape):
        return (torch.randn(*shape, device="cuda") / 2).to(torch.float8_e4m3fn)
    return fp8(m, k), fp8(n, k).t(), torch.tensor(0.7, device="cuda"), torch.tensor(1.3, device="cuda")


def input_sets(m: int, n: int, k: int) -> list[tuple]:
    """``operands`` sets holding >= 160 MB of b (past L2)."""
    return [operands(m, n, k) for _ in range(max(2, -(-160 * 2**20 // (n * k))))]


def timed(graphs: dict, calls: int, rounds: int, err: float) -> dict:
    """Median us per call of each graph (of ``calls`` calls), in rounds alternating the order."""
    us = {name: [] for name in graphs}
    for r in range(rounds):
        for name in (("ours", "cublas") if r % 2 == 0 else ("cublas", "ours")):
            us[name].append(launches_ms(graphs[name].replay, 20.0) / calls * 1000)
    ratios = [c / o for o, c in zip(us["ours"], us["cublas"])]
    return dict(ours_us=statistics.median(us["ours"]), cublas_us=statistics.median(us["cublas"]),
                ratio=statistics.median(ratios), lo=min(ratios), hi=max(ratios), rel_err=err)


def time_shape(m: int, n: int, k: int, rounds: int) -> dict:
    sets = input_sets(m, n, k)
    want = torch._scaled_mm(*sets[0], out_dtype=BF16).float()
    got = fp8_scaled_mm(*sets[0], out_dtype=BF16).float()
    err = float((got - want).abs().max() / want.abs().max())
    if err > 1e-2:
        raise AssertionError(f"{m}x{n}x{k}: relative error {err:.2e} against torch._scaled_mm")
    graphs = {"ours": capture_graph(lambda: [fp8_scaled_mm(*s, out_dtype=BF16) for s in sets], 10),
              "cublas": capture_graph(lambda: [torch._scaled_mm(*s, out_dtype=BF16) for s in sets], 10)}
    return timed(graphs, 10 * len(sets), rounds, err)


def chain_shape(m: int, n: int, k: int, rounds: int) -> dict:
    sets = input_sets(m, n, k)
    pairs = list(zip(sets, sets[1:] + sets[:1]))
    chains = {"ours": lambda first, second: fp8_scaled_mm(
                  *second, bias=fp8_scaled_mm(*first, out_dtype=BF16)[0], out_dtype=BF16),
              "cublas": lambda first, second: torch._scaled_mm(
                  *second, bias=torch._scaled_mm(*first, out_dtype=BF16)[0], out_dtype=BF16)}
    last: dict = {}        # each side's results of the last pass captured (replays refill them)

    def passes(name):
        def run():
            last[name] = [chains[name](*p) for p in pairs]
        return run
    graphs = {name: capture_graph(passes(name), 10) for name in chains}
    err = 0.0
    for name, graph in graphs.items():
        for out in last[name]:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for (first, second), out in zip(pairs, last[name]):
            want = exact(*second) + exact(*first)[0]
            err = max(err, float((out.double() - want).abs().max() / want.abs().max()))
    if not err <= 1e-2:
        raise AssertionError(f"{m}x{n}x{k} chain: relative error {err:.2e} against float64")
    return timed(graphs, 10 * len(pairs), rounds, err)


def table(folder: str) -> None:
    """Per row (shape, or shape and "chain"): the median over rounds of ours and cuBLAS (us) and
    of the speed, before (base) and after (new)."""
    runs = {which: [json.loads(p.read_text()) for p in sorted(pathlib.Path(folder).glob(f"g_{which}_*.json"))]
            for which in ("base", "new")}
    print(f"{'shape':<24} {'base us':>8} {'new us':>8} {'new/base':>8} {'cuBLAS us':>9} "
          f"{'speed base':>10} {'speed new':>9}   ({len(runs['base'])} / {len(runs['new'])} rounds)")
    for row in runs["new"][0] if runs["new"] else {}:
        med = {which: {key: statistics.median(r[row][key] for r in rs if row in r)
                       for key in ("ours_us", "cublas_us", "ratio")}
               for which, rs in runs.items() if any(row in r for r in rs)}
        if len(med) < 2:
            continue
        b, a = med["base"], med["new"]
        print(f"{row:<24} {b['ours_us']:>8.2f} {a['ours_us']:>8.2f} {a['ours_us'] / b['ours_us']:>8.3f} "
              f"{a['cublas_us']:>9.2f} {b['ratio']:>10.3f} {a['ratio']:>9.3f}")


def shape_list(text: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, s.split("x"))) for s in text.split(",")] if text else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", help="comma list of MxNxK (default: M 16/32/64/128 x 4096x4096, "
                                     "14336x4096, 4096x14336)")
    ap.add_argument("--chains", default="", help="comma list of MxNxK: also two dependent kernels "
                                                 "per call there (module docstring)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tag", default="", help="a word put before each line (ab_trees.sh: base / new)")
    ap.add_argument("--json")
    ap.add_argument("--table", metavar="DIR", help="print ab_trees.sh's before / after table and exit")
    args = ap.parse_args()
    if args.table:
        table(args.table)
        return
    rows = [(s, "", time_shape) for s in shape_list(args.shapes) or DECODE]
    rows += [(s, " chain", chain_shape) for s in shape_list(args.chains)]
    results = {}
    for (m, n, k), kind, measure in rows:
        r = results[f"{m}x{n}x{k}{kind}"] = measure(m, n, k, args.rounds)
        print(f"{args.tag} {m}x{n}x{k}{kind}: ours {r['ours_us']:.2f} us, cuBLAS {r['cublas_us']:.2f} us, "
              f"speed {r['ratio']:.3f}x ({r['lo']:.3f}..{r['hi']:.3f})", flush=True)
        if args.json:                      # after each row: a later failure keeps the rows before
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
