"""Where the GPU time of ``tilews.ops.attention``'s backward goes: every kernel the autograd
backward launches, with its GPU time per call (``torch.profiler``, CUDA activity), beside the
call's own time from CUDA events, and the same for SDPA's cuDNN backward. The probe
(``probe_attention_backward.py``) times each call from its launch (a few calls per timing, so the
host's latency to the first kernel counts); this gives the GPU's time alone.

    TILEWS_DEVICE_CMD='python scripts/profile_backward_op.py --shape 8,16,4096,64' bash scripts/device_run.sh
"""
from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from tilews.ops import attention


def report(name: str, backward, calls: int) -> float:
    """Print ``backward``'s time per call (CUDA events, ``calls`` back to back) and each kernel's
    GPU time per call (``torch.profiler``); returns the kernels' GPU time per call (ms)."""
    for _ in range(3):
        backward()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        backward()
    end.record()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            backward()
        torch.cuda.synchronize()
    # every kernel and memset in launch order: the backward's kernels share the name ``main``
    # (TileLang's convention), so each is told apart by its place in the call
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    per_call = len(kernels) // calls
    total = sum(e.device_time_total for e in kernels) / calls / 1000
    print(f"{name}: {start.elapsed_time(end) / calls:.3f} ms per backward (CUDA events), "
          f"kernels' GPU time {total:.3f} ms")
    for place in range(per_call):
        same = kernels[place::per_call]
        print(f"    {place}. {same[0].name[:66]:66} {sum(e.device_time_total for e in same) / len(same):9.1f} us")
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,16,4096,64", help="B,H,S,D (bhsd, fp16)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    B, H, S, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", generator=g).half().requires_grad_()
               for _ in range(3))
    do = torch.randn(B, H, S, D, device="cuda", generator=g).half()
    out = attention(q, k, v, is_causal=args.causal, layout="bhsd")
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
    print(f"B{B} H{H} S{S} D{D} {'causal' if args.causal else 'full'}")
    ours = report("tilews", lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                  args.calls)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(ref, (q, k, v), do, retain_graph=True)
    theirs = report("SDPA cuDNN", cudnn, args.calls)
    print(f"GPU time, tilews / cuDNN: {ours / theirs:.3f}")


if __name__ == "__main__":
    main()
