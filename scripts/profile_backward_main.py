"""Launch the attention backward's main kernel twice (the first launch compiles), for Nsight
Compute to profile the second (docs/measuring.md "Hardware counters"):

    ncu --clock-control none --kernel-name main --launch-skip 1 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --section SpeedOfLight \
        --section MemoryWorkloadAnalysis -f -o $OUT/bwd python scripts/profile_backward_main.py

``--dim``, ``--causal``, ``--element`` (dQ added by element atomics, not the op's choice for
``--dim``), ``--off`` (TILEWS_OVERLAP_GEMMS=off).
"""
from __future__ import annotations

import argparse
import os


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--element", action="store_true")
    parser.add_argument("--off", action="store_true")
    args = parser.parse_args()
    if args.off:
        os.environ["TILEWS_OVERLAP_GEMMS"] = "off"
    import torch
    import tilews.language as T
    from tilews.ops.attention_backward import blocks, kernels
    from tilews.ops.attention import lse_rows
    B, H, S, D = (4, 32, 4096, args.dim) if args.dim == 128 else (8, 16, 4096, args.dim)
    cfg = dict(blocks(D, True), **({"dq_tile_add": False} if args.element else {}))
    rows = lse_rows(S, 128)
    kern = kernels()[1](B, H, H, S, D, args.causal, rows, dtype=T.float16, **cfg)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(4))
    lse = torch.randn(B, H, rows, device="cuda").abs() + 5
    delta = torch.randn(B, H, rows, device="cuda")
    dq = torch.zeros(B, H, rows, D, device="cuda")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for _ in range(2):
        kern(q, k, v, do, lse, delta, dq, dk, dv)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
