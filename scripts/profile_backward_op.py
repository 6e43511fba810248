"""Where the GPU time of ``tilews.ops.attention``'s backward goes: every kernel the autograd
backward launches, with its GPU time per call (``torch.profiler``, CUDA activity), beside the
call's own time from CUDA events. The probe (``probe_attention_backward.py``) shows the whole
backward above its main kernel + preprocess + postprocess timed alone; this lists what else runs.

    TILEWS_DEVICE_CMD='python scripts/profile_backward_op.py --shape 8,16,4096,64' bash scripts/device_run.sh
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from tilews.ops import attention


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
    out = attention(q, k, v, is_causal=args.causal, layout="bhsd")
    do = torch.randn_like(out)

    def backward():
        return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    for _ in range(3):
        backward()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.calls):
        backward()
    end.record()
    torch.cuda.synchronize()
    print(f"B{B} H{H} S{S} D{D} {'causal' if args.causal else 'full'}: "
          f"{start.elapsed_time(end) / args.calls:.3f} ms per backward (CUDA events)")
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(args.calls):
            backward()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]   # kernels, memsets
    rows.sort(key=lambda e: -e.self_device_time_total)
    print(f"{'kernel':70} {'calls':>6} {'us per call':>12}")
    total = 0.0
    for e in rows:
        per = e.self_device_time_total / max(e.count, 1)
        total += e.self_device_time_total
        print(f"{e.key[:70]:70} {e.count:6d} {per:12.1f}")
    print(f"sum of GPU time: {total / args.calls / 1000:.3f} ms per backward")


if __name__ == "__main__":
    main()
