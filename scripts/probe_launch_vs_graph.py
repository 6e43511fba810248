"""Why the varlen forward is within 5% of the dense one from CUDA graphs but not launched back to
back (issue 40): every kernel of each call, launched and graph-replayed, dense and varlen, with
the GPU's clock and power at the time.

    python scripts/probe_launch_vs_graph.py [--dims 128] [--calls 60] [--rounds 3] [--rest 0.5]

Shapes: bf16, B8 H16 S4096 (the probe's ``--equal`` case): ``tilews.ops.attention`` on
[B, S, H, D] (BSHD) and ``tilews.ops.attention_varlen`` on the same tokens as B sequences of S,
causal and not. Each phase is one op in one mode, run under ``torch.profiler`` (CUDA activity
only: every kernel, memset and copy on the GPU, with its start and duration) after ``--rest``
seconds of idle GPU, so every phase starts from the same power state:

* ``launched``: ``--calls`` calls back to back, as ``probe_attention_varlen.py`` (without
  ``--graphs``) and an eager training step issue them;
* ``synced``: the same calls, each followed by ``torch.cuda.synchronize()``: each kernel alone
  after a short idle (a kernel slower when it follows another at once shows here as faster);
* ``graph``: one replay of a CUDA graph of ``--calls`` calls (captured once per op, before the
  rounds).

Phases run in interleaved rounds; even rounds time dense first, odd rounds varlen first (a fixed
order would give the second op a GPU that the first one has just heated). A background
``nvidia-smi`` samples the SM clock, power and temperature every 20 ms; each phase gets the
samples that fall inside it.

Per phase the table gives: GPU ops per call (kernels + memsets + copies: one expected), the
kernel's median duration, that of the first call and the mean of the last half (a rising time
over the burst is the clock falling), the idle gap between consecutive kernels (median and sum
per call: host-bound launches or host syncs show here), the burst's span per call (first start
to last end, over calls: what ``launches_ms`` measures less the first launch's latency), and the
median SM clock (MHz) and power (W) sampled in the phase. The last table: per shape and mode,
varlen / dense of the kernel's median duration and of the span, with the clocks each ran at.

What each hypothesis predicts:
  host sync or host-bound launch  -> launched gaps >> 0 (graph gaps ~0), span > kernel time;
  extra per-call GPU work          -> more than 1 GPU op per call launched (1 in the graph);
  power / clock state              -> kernel time follows the clock (first vs last half, and
                                      between phases), the ratio moves with the order;
  back-to-back slowdown            -> launched kernel > synced kernel at the same clock;
  the kernel itself, launched      -> varlen / dense of the kernel's duration differs between
                                      launched and graph at the same clocks.

JSON: ``$OUT/probe_launch_vs_graph.json`` (every phase, every kernel's duration and gap). About
60-90 s on an H200 with the kernels compiled (4 Gluon compiles on a fresh machine add ~1-2 min).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_compare as pc  # noqa: E402

B, H, S = 8, 16, 4096
GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"


def ops(D: int, causal: bool) -> dict:
    """name -> zero-argument call, each run once (compiled) here."""
    import torch
    from tilews.ops import attention, attention_varlen
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qv, kv, vv = (t.view(B * S, H, D) for t in (q, k, v))
    cu = torch.arange(0, B * S + 1, S, dtype=torch.int32, device="cuda")
    calls = {"dense": lambda: attention(q, k, v, is_causal=causal, layout="bshd"),
             "varlen": lambda: attention_varlen(qv, kv, vv, cu, cu, S, S, causal=causal)}
    want = calls["dense"]().view(B * S, H, D).float()
    got = calls["varlen"]().float()
    err = float((got - want).abs().max() / want.abs().max())
    if err > 2e-2:
        raise SystemExit(f"varlen differs from dense by {err:.3g} (D{D} causal={causal})")
    torch.cuda.synchronize()
    return calls


def gpu_ops(trace: Path) -> list[tuple[str, str, float, float]]:
    """(category, name, start us, duration us) of every GPU op in a chrome trace, by start."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    found = [(e["cat"], e.get("name", ""), float(e["ts"]), float(e.get("dur", 0.0)))
             for e in events if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X"]
    return sorted(found, key=lambda e: e[2])


def run_phase(fn, graph, mode: str, calls: int, rest: float) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    time.sleep(rest)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.time()
        start.record()
        if mode == "graph":
            graph.replay()
        elif mode == "launched":
            for _ in range(calls):
                fn()
        else:
            for _ in range(calls):
                fn()
                torch.cuda.synchronize()
        end.record()
        torch.cuda.synchronize()
        t1 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        found = gpu_ops(path)
    kernels = [e for e in found if e[0] == "kernel"]
    durs = [e[3] for e in kernels]
    gaps = [b[2] - (a[2] + a[3]) for a, b in zip(found, found[1:])]
    span = (found[-1][2] + found[-1][3] - found[0][2]) if found else 0.0
    names = sorted({e[1][:40] for e in found})
    return {"mode": mode, "t0": t0, "t1": t1, "gpu_ops": len(found), "names": names,
            "kernel_us": durs, "gaps_us": gaps, "span_us": span,
            "events_ms_per_call": start.elapsed_time(end) / calls}


def summarize(p: dict, calls: int) -> dict:
    durs, gaps = p["kernel_us"], p["gaps_us"]
    half = durs[len(durs) // 2:]
    return {"ops_per_call": p["gpu_ops"] / calls,
            "kernel_ms": statistics.median(durs) / 1e3 if durs else float("nan"),
            "first_ms": durs[0] / 1e3 if durs else float("nan"),
            "last_half_ms": statistics.mean(half) / 1e3 if half else float("nan"),
            "gap_med_us": statistics.median(gaps) if gaps else 0.0,
            "gap_sum_us_per_call": sum(gaps) / calls,
            "span_ms_per_call": p["span_us"] / calls / 1e3,
            "events_ms_per_call": p["events_ms_per_call"]}


class Smi:
    """``nvidia-smi`` sampling every 20 ms in the background; ``samples(t0, t1)`` -> (clock MHz,
    power W, temperature C) of the samples between two ``time.time()`` values."""

    def __init__(self):
        self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        try:
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}",
                                          "--format=csv,noheader,nounits", "-lms", "20"],
                                         stdout=self.file, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def stop(self) -> list[tuple[float, float, float, float]]:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        rows = []
        for line in Path(self.file.name).read_text().splitlines():
            parts = [x.strip() for x in line.split(",")]
            try:
                stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((stamp, float(parts[1]), float(parts[2]), float(parts[3])))
            except (ValueError, IndexError):
                continue
        os.unlink(self.file.name)
        return rows


def in_phase(rows, t0: float, t1: float) -> dict:
    inside = [r for r in rows if t0 <= r[0] <= t1]
    if not inside:
        return {"sm_mhz": float("nan"), "power_w": float("nan"), "temp_c": float("nan"), "samples": 0}
    return {"sm_mhz": statistics.median(r[1] for r in inside),
            "power_w": statistics.median(r[2] for r in inside),
            "temp_c": max(r[3] for r in inside), "samples": len(inside)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs="*", default=[128])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rest", type=float, default=0.5, help="idle seconds before each phase")
    args = ap.parse_args()
    import torch
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    shapes = [(D, c) for D in args.dims for c in causals]
    prepared = {}
    for D, causal in shapes:
        calls = ops(D, causal)
        prepared[(D, causal)] = {n: (fn, pc.capture_graph(fn, args.calls)) for n, fn in calls.items()}
    smi = Smi()
    time.sleep(0.2)
    phases = []
    for r in range(args.rounds):
        for D, causal in shapes:
            order = ("dense", "varlen") if r % 2 == 0 else ("varlen", "dense")
            for mode in ("launched", "graph", "synced"):
                for op in order:
                    fn, graph = prepared[(D, causal)][op]
                    p = run_phase(fn, graph, mode, args.calls, args.rest)
                    phases.append({"round": r, "D": D, "causal": causal, "op": op,
                                   "first": op == order[0], **p})
    rows = smi.stop()
    for p in phases:
        p.update(summarize(p, args.calls), **in_phase(rows, p["t0"], p["t1"]))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "probe_launch_vs_graph.json").write_text(
            json.dumps({"calls": args.calls, "rest": args.rest, "phases": phases, "smi": rows}))
    print(f"\nEvery phase ({args.calls} calls, {args.rest} s idle before; ms per call; "
          f"first = this op ran first in its round)")
    head = (f"{'D':>4} {'causal':>6} {'mode':>8} {'op':>6} {'rnd':>3} {'1st':>3} {'ops/call':>8} "
            f"{'kernel':>7} {'first':>7} {'lasthalf':>8} {'gap med us':>10} {'gap us/call':>11} "
            f"{'span':>7} {'events':>7} {'SM MHz':>6} {'W':>5} {'C':>3}  kernels")
    print(head)
    for p in phases:
        print(f"{p['D']:>4} {str(p['causal']):>6} {p['mode']:>8} {p['op']:>6} {p['round']:>3} "
              f"{'y' if p['first'] else 'n':>3} {p['ops_per_call']:>8.2f} {p['kernel_ms']:>7.3f} "
              f"{p['first_ms']:>7.3f} {p['last_half_ms']:>8.3f} {p['gap_med_us']:>10.1f} "
              f"{p['gap_sum_us_per_call']:>11.1f} {p['span_ms_per_call']:>7.3f} "
              f"{p['events_ms_per_call']:>7.3f} {p['sm_mhz']:>6.0f} {p['power_w']:>5.0f} "
              f"{p['temp_c']:>3.0f}  {','.join(p['names'])}")
    print("\nvarlen / dense, medians over rounds (kernel: the kernel's median duration; span: "
          "the burst per call; MHz: median SM clock dense / varlen)")
    print(f"{'D':>4} {'causal':>6} {'mode':>8} {'dense kern':>10} {'varlen kern':>11} {'ratio':>6} "
          f"{'dense span':>10} {'varlen span':>11} {'ratio':>6} {'MHz d/v':>11} {'gap us/call d/v':>16}")
    for D, causal in shapes:
        for mode in ("launched", "graph", "synced"):
            sel = {op: [p for p in phases if (p["D"], p["causal"], p["mode"], p["op"]) == (D, causal, mode, op)]
                   for op in ("dense", "varlen")}
            med = {op: {k: statistics.median(p[k] for p in ps) for k in
                        ("kernel_ms", "span_ms_per_call", "sm_mhz", "gap_sum_us_per_call")}
                   for op, ps in sel.items()}
            d, v = med["dense"], med["varlen"]
            print(f"{D:>4} {str(causal):>6} {mode:>8} {d['kernel_ms']:>10.3f} {v['kernel_ms']:>11.3f} "
                  f"{v['kernel_ms'] / d['kernel_ms']:>6.3f} {d['span_ms_per_call']:>10.3f} "
                  f"{v['span_ms_per_call']:>11.3f} {v['span_ms_per_call'] / d['span_ms_per_call']:>6.3f} "
                  f"{d['sm_mhz']:>5.0f}/{v['sm_mhz']:<5.0f} "
                  f"{d['gap_sum_us_per_call']:>7.1f}/{v['gap_sum_us_per_call']:<8.1f}")


if __name__ == "__main__":
    main()
