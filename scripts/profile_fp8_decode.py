"""Nsight Compute on an FP8 decode GEMM: ``tilews.ops.fp8_scaled_mm`` with per-tensor scales
against ``torch._scaled_mm`` (cuBLAS) at one shape, each kernel profiled once by its own ``ncu``
run, then one table of both (``ncu_compare.py``: time, issue slots, occupancy, DRAM bytes and
throughput, tensor pipe, stall reasons) with cuBLAS / tilews. ``$OUT`` keeps the reports, raw
metrics and per-SASS-instruction stall samples (``tilews_sass.csv``, ``cublas_sass.csv``).

    TILEWS_DEVICE_CMD='python scripts/profile_fp8_decode.py --shape 16x4096x4096 --out $OUT' bash scripts/device_run.sh

About 30-60 s (one compile, two ncu runs of a ~10 us kernel).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ncu_compare import print_table, profile

CUBLAS = "regex:nvjet|gemm|xmma|cutlass"     # the cuBLAS kernel's name, whichever it picks


def launch(kind: str, m: int, n: int, k: int) -> None:
    import torch
    from probe_fp8_graph_time import operands
    from tilews.ops import fp8_scaled_mm
    a, b, sa, sb = operands(m, n, k)
    for _ in range(2):                # the first tilews call compiles: ncu profiles the second
        if kind == "tilews":
            fp8_scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        else:
            torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="16x4096x4096", help="MxNxK")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--launch", choices=("tilews", "cublas"), help=argparse.SUPPRESS)
    args = p.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    if args.launch:
        return launch(args.launch, m, n, k)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, os.path.abspath(__file__), "--shape", args.shape]
    got = {kind: profile(kind, name, [*command, "--launch", kind], out, args.ncu)
           for kind, name in (("tilews", "main"), ("cublas", CUBLAS))}
    print(f"\nFP8 e4m3 {args.shape} tensorwise, bf16 out")
    print_table("tilews", "cublas", got)


if __name__ == "__main__":
    main()
