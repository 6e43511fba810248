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
import os
import sys
from pathlib import Path

from ncu_compare import print_table, profile

B, H, S, D = 8, 16, 4096, 128


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
    command = [sys.executable, os.path.abspath(__file__), *(["--causal"] if args.causal else [])]
    got = {kind: profile(kind, "main", [*command, "--launch", kind], out, args.ncu)
           for kind in ("dense", "varlen")}
    print(f"\nB{B} H{H} S{S} D{D} bf16 {'causal' if args.causal else 'non-causal'} forward")
    print_table("dense", "varlen", got)


if __name__ == "__main__":
    main()
