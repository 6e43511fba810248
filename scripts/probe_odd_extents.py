"""Tiles whose extents are not powers of two on Hopper: attention at head dims 96 and 192 (and the
wide head dim 256: its output stored from registers so that K/V get two ring slots) and a
GEMM with a 192-wide tile, on the warp-specialized Gluon path (split_extents cuts them into
power-of-two pieces: 192 = 128 + 64, 96 = 64 + 32).

Each case is built from TileLang's own kind of program (``tilews.ops.attention``'s
``mha_fwd_program``, ``examples/gemm.py``'s ``matmul``) for target ``hopper``; the script says
which backend took it (``gluon`` is the point), checks the result against torch in float32, and
times it with ``tilews.profiler.do_bench`` interleaved with torch's
``scaled_dot_product_attention`` (its cuDNN backend) / ``torch.matmul`` on the same inputs over ``--rounds`` rounds
(the median of each). It prints a table and, with ``$OUT`` set, writes
``$OUT/probe_odd_extents.json``.

    python scripts/probe_odd_extents.py [--rounds 5] [--only attention|gemm]

Needs a CUDA GPU of compute capability 9.0 (torch 2.11, triton 3.6); elsewhere it says so and
exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tilews
from examples.gemm import matmul
from tilews.ops.attention import mha_fwd_program
from tilews.profiler import do_bench
from tilews.testing import rel_err

# (batch, heads, seq_len, dim, causal, block_N, stages): 128 query rows per block, two consumer
# warp groups; at D=192 64-row K/V blocks (two stages of K and V fit shared memory beside Q, O)
ATTENTION = [(4, 16, 4096, 96, False, 128, 2), (4, 16, 4096, 96, True, 128, 2),
             (4, 16, 4096, 192, False, 64, 2), (4, 16, 4096, 192, True, 64, 2),
             (4, 16, 4096, 256, False, 64, 1), (4, 16, 4096, 256, True, 64, 1)]
# (M, N, K, block_M, block_N, block_K, stages, threads)
GEMM = [(8192, 8064, 8192, 128, 192, 64, 3, 256), (4096, 4224, 4096, 128, 192, 64, 3, 256)]


def need_gpu() -> None:
    """Exit with status 2, saying why, unless a Hopper GPU is here."""
    why = None
    if not torch.cuda.is_available():
        why = "no CUDA device here; run it on a Hopper (sm_90) GPU machine"
    elif torch.cuda.get_device_capability() != (9, 0):
        why = f"the GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}; the Gluon path needs sm_90"
    if why:
        print(f"probe_odd_extents: {why}", file=sys.stderr)
        sys.exit(2)


def attention_cases():
    for B, H, S, D, causal, bn, stages in ATTENTION:
        kernel = tilews.jit(out_idx=[3], target="hopper")(mha_fwd_program)(
            B, H, S, D, causal, block_M=128, block_N=bn, num_stages=stages, threads=256)
        g = torch.Generator(device="cuda").manual_seed(D + causal)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                is_causal=causal)
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        yield (f"attention D{D} {'causal' if causal else 'full'} B{B} H{H} S{S} bn{bn}", kernel,
               lambda kernel=kernel, q=q, k=k, v=v: kernel(q, k, v), want,
               lambda q=q, k=k, v=v, c=causal: cudnn_attention(q, k, v, c), flops)


def cudnn_attention(q, k, v, causal):
    """SDPA through its cuDNN backend (the reference the issues' targets name)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def gemm_cases():
    for M, N, K, bm, bn, bk, stages, threads in GEMM:
        kernel = tilews.jit(out_idx=[-1], target="hopper")(matmul.fn)(
            M, N, K, block_M=bm, block_N=bn, block_K=bk, num_stages=stages, threads=threads)
        g = torch.Generator(device="cuda").manual_seed(N)
        a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g)
        yield (f"gemm {M}x{N}x{K} tile {bm}x{bn}x{bk}", kernel, lambda kernel=kernel, a=a, b=b: kernel(a, b),
               a.float() @ b.float(), lambda a=a, b=b: torch.matmul(a, b), 2 * M * N * K)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=("attention", "gemm"))
    args = parser.parse_args()
    need_gpu()
    makers = {"attention": attention_cases, "gemm": gemm_cases}
    cases = [c for name, make in makers.items() if args.only in (None, name) for c in make()]
    rows, timings = [], {name: ([], []) for name, *_ in cases}
    for name, kernel, run, want, _, _ in cases:
        err = rel_err(run().float(), want)
        rows.append({"case": name, "backend": kernel.report.backend, "target": kernel.target,
                     "rel_err": err, "ok": err < 1e-2,
                     "notes": [n for n in kernel.report.notes if "split_extents" in n or "refused" in n]})
    for _ in range(args.rounds):            # interleaved: each round times every case and its baseline
        for name, _, run, _, baseline, _ in cases:
            timings[name][0].append(do_bench(run))
            timings[name][1].append(do_bench(baseline))
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  rounds {args.rounds}")
    print(f"{'case':<48} {'backend':<7} {'rel_err':>8} {'tilews ms':>10} {'torch ms':>9} {'ratio':>6} {'TFLOP/s':>8}")
    for row, (name, *_, flops) in zip(rows, cases):
        ours, theirs = (statistics.median(t) for t in timings[name])
        row.update(tilews_ms=ours, torch_ms=theirs, speedup=theirs / ours, tflops=flops / ours / 1e9,
                   tilews_ms_rounds=timings[name][0], torch_ms_rounds=timings[name][1])
        print(f"{name:<48} {row['backend']:<7} {row['rel_err']:>8.1e} {ours:>10.3f} {theirs:>9.3f} "
              f"{theirs / ours:>6.2f} {row['tflops']:>8.1f}")
        for note in row["notes"]:
            print(f"    {note}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "probe_odd_extents.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds,
             "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
