"""Nsight Compute on the attention backward's main kernel beside cuDNN's (issue 40's D128 target;
docs/measuring.md "Hardware counters"): B4 H32 S4096 D128 fp16 (``--dim 64``: B8 H16), the op's
main kernel at its blocks, unsplit (``profile_backward_main.py``), and the longest kernel of SDPA
cuDNN's backward (found by name with torch's profiler first), each profiled once by its own
``ncu`` run, then one table of both: time, issue slots busy, instructions, occupancy, L2 hit
rate, DRAM traffic, tensor pipe, stall reasons (cycles per issued instruction), cuDNN / ours.
``$OUT`` keeps the reports, raw metrics and per-SASS stall samples.

    TILEWS_DEVICE_CMD='python scripts/profile_backward_vs_cudnn.py --out $OUT' bash scripts/device_run.sh
    ... --causal, --dim 64, --ncu PATH
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ncu_compare import print_table, profile

HERE = Path(__file__).resolve().parent


def sizes(dim: int) -> tuple[int, int, int, int]:
    return (4, 32, 4096, dim) if dim == 128 else (8, 16, 4096, dim)


def cudnn_backward(dim: int, causal: bool, calls: int):
    """SDPA cuDNN's backward ``calls`` times on one forward's graph."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, H, S, D = sizes(dim)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = torch.randn_like(out)
    for _ in range(calls):
        out.backward(grad, retain_graph=True)
    torch.cuda.synchronize()


def cudnn_main_kernel(dim: int, causal: bool) -> str:
    """The name of the longest kernel of cuDNN's backward, as an ncu ``regex:`` filter."""
    import torch
    cudnn_backward(dim, causal, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        cudnn_backward(dim, causal, 1)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    longest = max(kernels, key=lambda e: e.device_time_total).name
    print(f"cuDNN's longest backward kernel: {longest}")
    return "regex:^" + re.escape(longest.split("(")[0]) + "$"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=128, choices=(64, 128))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--launch-cudnn", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.launch_cudnn:
        return cudnn_backward(args.dim, args.causal, 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags = ["--dim", str(args.dim), *(["--causal"] if args.causal else [])]
    got = {"tilews": profile("tilews", "main", [sys.executable, str(HERE / "profile_backward_main.py"),
                                               *flags], out, args.ncu),
           "cudnn": profile("cudnn", cudnn_main_kernel(args.dim, args.causal),
                            [sys.executable, os.path.abspath(__file__), *flags, "--launch-cudnn"],
                            out, args.ncu)}
    B, H, S, D = sizes(args.dim)
    print(f"\nB{B} H{H} S{S} D{D} fp16 {'causal' if args.causal else 'non-causal'} backward, "
          "main kernels")
    print_table("tilews", "cudnn", got)


if __name__ == "__main__":
    main()
