"""Nsight Compute on the attention forward, dense beside varlen at the same tokens (issue 40's
varlen target; docs/measuring.md "Hardware counters"): B8 H16 S4096 D128 bf16, the dense op on
[B, S, H, D] and ``attention_varlen`` on the same tokens as B sequences of S (the probe's
``--equal`` case), each kernel profiled once by its own ``ncu`` run, then one table of both:
time, issue slots busy, achieved occupancy, L2 hit rate, DRAM traffic, tensor pipe, and the
stall reasons (cycles per issued instruction), with varlen / dense. ``$OUT`` keeps each report
(``dense.ncu-rep``, ``varlen.ncu-rep``), their raw metrics (``*_raw.csv``) and the warp-stall
samples per SASS instruction (``*_sass.csv``: compare the K/V loops line by line).

    TILEWS_DEVICE_CMD='python scripts/profile_varlen_forward.py --out $OUT' bash scripts/device_run.sh
    ... --causal        the causal kernels instead
    ... --ncu PATH      the ncu binary (default: ncu on PATH)

About 60-120 s on an H200 (two compiles, two ncu runs of ~10 replay passes of a 1-2 ms kernel).
``--launch KIND`` is what each ncu run executes: the op twice (the first launch compiles; ncu
profiles the second kernel named ``main``).
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

B, H, S, D = 8, 16, 4096, 128
SECTIONS = ("SpeedOfLight", "WarpStateStats", "SchedulerStats", "Occupancy", "LaunchStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SourceCounters")
# the raw metrics the table shows (regular expressions over ncu's raw page names)
ROWS = (r"gpu__time_duration\.sum", r"smsp__issue_active\.avg\.pct_of_peak_sustained_active",
        r"smsp__inst_executed\.sum$", r"sm__warps_active\.avg\.pct_of_peak_sustained_active",
        r"lts__t_sector_hit_rate\.pct", r"dram__bytes_read\.sum$",
        r"sm__throughput\.avg\.pct_of_peak_sustained_elapsed",
        r"sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_(active|elapsed)",
        r"smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")


def launch(kind: str, causal: bool):
    import torch
    from tilews.ops import attention, attention_varlen
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device="cuda")
    for _ in range(2):
        if kind == "dense":
            attention(q, k, v, is_causal=causal, layout="bshd")
        else:
            attention_varlen(*(t.reshape(B * S, H, D) for t in (q, k, v)), cu, cu, S, S,
                             causal=causal)
    torch.cuda.synchronize()


def profile(kind: str, causal: bool, out: Path, ncu: str) -> dict:
    """{metric: (unit, value)} of the ``kind`` kernel's raw page; writes its report and CSVs."""
    rep = out / kind
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "main", "--launch-skip", "1",
           "--launch-count", "1", *[a for s in SECTIONS for a in ("--section", s)], "-f", "-o",
           str(rep), sys.executable, os.path.abspath(__file__), "--launch", kind,
           *(["--causal"] if causal else [])]
    subprocess.run(cmd, check=True)
    raw = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv"],
                         check=True, capture_output=True, text=True).stdout
    (out / f"{kind}_raw.csv").write_text(raw)
    with open(out / f"{kind}_sass.csv", "w") as fh:
        subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "source", "--csv",
                        "--print-source", "sass"], check=True, stdout=fh)
    names, units, values = list(csv.reader(raw.splitlines()))[:3]
    return {n: (u, v) for n, u, v in zip(names, units, values)}


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--launch", choices=("dense", "varlen"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.launch:
        return launch(args.launch, args.causal)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    got = {kind: profile(kind, args.causal, out, args.ncu) for kind in ("dense", "varlen")}
    print(f"\nB{B} H{H} S{S} D{D} bf16 {'causal' if args.causal else 'non-causal'} forward")
    print(f"{'metric':<78} {'unit':<8} {'dense':>12} {'varlen':>12} {'v/d':>6}")
    for pattern in ROWS:
        for name in sorted(n for n in got["dense"] if re.search(pattern, n)):
            unit, d = got["dense"][name]
            v = got["varlen"].get(name, ("", ""))[1]
            dn, vn = number(d), number(v)
            if "issue_stalled" in name and max(dn or 0, vn or 0) < 0.05:
                continue                                 # a stall reason neither kernel has
            ratio = f"{vn / dn:6.2f}" if dn and vn is not None else ""
            print(f"{name:<78} {unit:<8} {d:>12} {v:>12} {ratio}")


if __name__ == "__main__":
    main()
