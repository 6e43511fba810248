"""Varlen attention against dense attention at equal total tokens, on a GPU: for each shape,
``tilews.ops.attention`` on [B, H, S, D] (BSHD) and ``tilews.ops.attention_varlen`` on the same
B * S tokens cut into B sequences of random lengths (fixed seed, mean S; ``--equal`` makes them all
S: the varlen kernel's own overhead), forward and forward + backward, interleaved rounds, median
times and the varlen / dense ratio (issue 40's target: the forward within 5%); dense and varlen
take turns at going first in a round. Varlen does fewer
FLOPs with ragged lengths (sum of len^2 < B * S^2), so the table gives both times and TFLOP/s.

    TILEWS_DEVICE_CMD='python scripts/probe_attention_varlen.py --rounds 7' bash scripts/device_run.sh
    python scripts/probe_attention_varlen.py --equal --rounds 7
    python scripts/probe_attention_varlen.py --equal --graphs --passes fwd   # GPU time alone
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_compare as pc  # noqa: E402

SHAPES = [(B, 16, 4096, D, c) for B in (8, 16) for D in (64, 128) for c in (False, True)]


def lengths(torch, B, S, equal, seed=0):
    if equal:
        return [S] * B
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randint(1, B * S, (B - 1,), generator=g).tolist())
    return [b - a for a, b in zip([0, *cuts], [*cuts, B * S])]


def main():
    import torch
    from tilews.ops import attention, attention_varlen
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--equal", action="store_true", help="every sequence S long")
    p.add_argument("--only", type=int, nargs="*", help="indices into SHAPES")
    p.add_argument("--graphs", action="store_true",
                   help="time from CUDA graphs (the GPU's time alone) instead of launches")
    p.add_argument("--passes", nargs="*", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    args = p.parse_args()
    print(f"{'B':>3} {'H':>3} {'S':>5} {'D':>4} {'causal':>6} {'pass':>8} {'dense ms':>9} "
          f"{'varlen ms':>10} {'ratio':>6} {'dense TF':>9} {'varlen TF':>10}")
    for B, H, S, D, causal in [s for i, s in enumerate(SHAPES) if args.only is None or i in args.only]:
        lens = lengths(torch, B, S, args.equal)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qv, kv, vv = (t.reshape(B * S, H, D) for t in (q, k, v))
        do = torch.randn_like(q)
        flops_dense = 4.0 * B * S * S * H * D / (2 if causal else 1)
        flops_var = sum(4.0 * n * n * H * D / (2 if causal else 1) for n in lens)
        for pass_ in args.passes:
            if pass_ == "fwd":
                dense = lambda: attention(q, k, v, is_causal=causal, layout="bshd")  # noqa: E731
                var = lambda: attention_varlen(qv, kv, vv, cu, cu, max(lens), max(lens), causal=causal)  # noqa: E731
            else:
                for t in (q, k, v):
                    t.requires_grad_()
                dense = lambda: attention(q, k, v, is_causal=causal, layout="bshd").backward(do)  # noqa: E731
                qv2, kv2, vv2 = (t.detach().reshape(B * S, H, D).requires_grad_() for t in (q, k, v))
                var = lambda: attention_varlen(qv2, kv2, vv2, cu, cu, max(lens), max(lens),  # noqa: E731
                                               causal=causal).backward(do.reshape(B * S, H, D))
            times = {"dense": [], "varlen": []}
            timer = pc.graph_ms if args.graphs else pc.launches_ms
            for r in range(args.rounds):     # each first in every other round
                for name in (("dense", "varlen") if r % 2 == 0 else ("varlen", "dense")):
                    times[name].append(timer(dense if name == "dense" else var))
            d, vt = (statistics.median(times[n]) for n in ("dense", "varlen"))
            print("   per round (dense, varlen ms; dense first in even rounds):",
                  [(round(a, 3), round(b, 3)) for a, b in zip(times["dense"], times["varlen"])])
            mult = 1 if pass_ == "fwd" else 3.5
            print(f"{B:>3} {H:>3} {S:>5} {D:>4} {str(causal):>6} {pass_:>8} {d:>9.3f} {vt:>10.3f} "
                  f"{vt / d:>6.2f} {mult * flops_dense / d / 1e9:>9.1f} {mult * flops_var / vt / 1e9:>10.1f}")


if __name__ == "__main__":
    main()
