"""Nsight Compute, two kernels side by side: each profiled once by its own ``ncu`` run of a
command, then one table of the raw metrics that say where time goes (time, issue slots busy,
occupancy, L2 hit rate, DRAM traffic and throughput, tensor pipe, the stall reasons in cycles per
issued instruction), with the second kernel's value over the first's. Used by
``profile_varlen_forward.py`` and ``profile_fp8_decode.py``; each report, its raw metrics
(``<label>_raw.csv``) and its warp-stall samples per SASS instruction (``<label>_sass.csv``) stay
in the output folder.
"""
from __future__ import annotations

import csv
import re
import subprocess
from pathlib import Path

SECTIONS = ("SpeedOfLight", "WarpStateStats", "SchedulerStats", "Occupancy", "LaunchStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SourceCounters")
# the raw metrics the table shows (regular expressions over ncu's raw page names)
ROWS = (r"gpu__time_duration\.sum", r"smsp__issue_active\.avg\.pct_of_peak_sustained_active",
        r"smsp__inst_executed\.sum$", r"sm__warps_active\.avg\.pct_of_peak_sustained_active",
        r"launch__grid_size$", r"launch__registers_per_thread$",
        r"lts__t_sector_hit_rate\.pct", r"dram__bytes_read\.sum$",
        r"dram__throughput\.avg\.pct_of_peak_sustained_elapsed",
        r"sm__throughput\.avg\.pct_of_peak_sustained_elapsed",
        r"sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_(active|elapsed)",
        r"smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")


def profile(label: str, kernel: str, command: list[str], out: Path, ncu: str) -> dict:
    """{metric: (unit, value)} of the second launch of the kernel named ``kernel`` (ncu's
    ``--kernel-name`` syntax, e.g. ``regex:nvjet``) by ``command`` (the first may compile); writes
    ``label``'s report and CSVs under ``out``."""
    rep = out / label
    subprocess.run([ncu, "--clock-control", "none", "--kernel-name", kernel, "--launch-skip",
                    "1", "--launch-count", "1", *[a for s in SECTIONS for a in ("--section", s)],
                    "-f", "-o", str(rep), *command], check=True)
    raw = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv"],
                         check=True, capture_output=True, text=True).stdout
    (out / f"{label}_raw.csv").write_text(raw)
    with open(out / f"{label}_sass.csv", "w") as fh:
        subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "source", "--csv",
                        "--print-source", "sass"], check=True, stdout=fh)
    names, units, values = list(csv.reader(raw.splitlines()))[:3]
    return {n: (u, v) for n, u, v in zip(names, units, values)}


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def print_table(first: str, second: str, got: dict) -> None:
    """The ``ROWS`` metrics of ``got[first]`` and ``got[second]``, and second / first."""
    print(f"{'metric':<78} {'unit':<8} {first:>12} {second:>12} {'ratio':>6}")
    for pattern in ROWS:
        for name in sorted(n for n in got[first] if re.search(pattern, n)):
            unit, a = got[first][name]
            b = got[second].get(name, ("", ""))[1]
            an, bn = number(a), number(b)
            if "issue_stalled" in name and max(an or 0, bn or 0) < 0.05:
                continue                                 # a stall reason neither kernel has
            ratio = f"{bn / an:6.2f}" if an and bn is not None else ""
            print(f"{name:<78} {unit:<8} {a:>12} {b:>12} {ratio}")
