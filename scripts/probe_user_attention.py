"""TileLang's own attention forward programs (``flash_attention/example_mha_fwd_bshd.py`` and
``example_mha_fwd_bhsd.py``, imports rewritten to tilews, as ``peer_compare.py`` loads them)
compiled by tilews, beside SDPA cuDNN and ``tilews.ops.attention``, timed in interleaved rounds
in one process on one GPU (issue 41: a user's program should run as fast as the op).

    python scripts/probe_user_attention.py [--rounds 5] [--cases d64,d64_causal,d128,d128_causal]

Shapes: D64 at B8 H16 S4096, D128 at B4 H32 S4096 (the op's forward rows in performance.md);
every program with 128 x 128 blocks, 2 stages, 256 threads (the op's blocks on a GPU) and the
examples' fast math. Rows per case:

* ``SDPA cuDNN``: the baseline, BHSD tensors;
* ``op bhsd``: ``tilews.ops.attention`` on the same tensors;
* ``user bshd``: the bshd example on BSHD copies of them (the compiler's schedule now);
* ``user bshd, in launch order``: the same, ``longest_first`` patched off (causal cases only: the
  compiler as it was before it numbered the causal query blocks backwards);
* ``user bshd, mask before gemm``: the same, ``mask_after_gemm`` and ``overlap_softmax``'s
  placement of the P cast next to the P V wgmma patched off (the compiler before both: the mask
  a branch before each Q K^T, P cast at the end of each iteration);
* ``user bhsd``: the bhsd example (``seq_kv = seq_q``) on the BHSD tensors (the layout's share of
  any gap).

Each output is checked against cuDNN's first (max |error| / max |cuDNN|). The table gives each
row's median time and its median ratio cuDNN time / its time (> 1: faster than cuDNN) with the
spread (min-max over rounds). The disk cache is off (its key does not see the patch). JSON goes
to ``$OUT/probe_user_attention.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys

os.environ["TILEWS_DISABLE_CACHE"] = "1"    # the disk cache's key does not see the patch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_compare as pc  # noqa: E402

SHAPES = {64: (8, 16, 4096), 128: (4, 32, 4096)}
BLOCKS = dict(block_M=128, block_N=128, num_stages=2, threads=256)
CASES = {f"d{d}{'_causal' if c else ''}": (d, c) for d in (64, 128) for c in (False, True)}


@contextlib.contextmanager
def launch_order():
    """``longest_first`` finds no growing loop: the blocks keep their launch order."""
    from tilews.lowering.passes import longest_first
    real = longest_first._trips
    longest_first._trips = lambda loops, var, g: None
    try:
        yield
    finally:
        longest_first._trips = real


@contextlib.contextmanager
def mask_before_gemm():
    """The scores' mask stays before the gemm and P is cast at the end of each iteration."""
    from tilews.lowering.passes import mask_after_gemm, overlap_softmax
    moved, operands = mask_after_gemm._moved, overlap_softmax._operands_first
    mask_after_gemm._moved = lambda nest, gemm: None
    overlap_softmax._operands_first = lambda middle2, reads: ((), tuple(middle2))
    try:
        yield
    finally:
        mask_after_gemm._moved, overlap_softmax._operands_first = moved, operands


def kernels(dim, causal, q, k, v):
    """label -> a zero-argument launch returning [batch, heads, seq, dim] output."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tilews.ops import attention
    batch, heads, seq = SHAPES[dim]
    q_s, k_s, v_s = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    out = {"SDPA cuDNN": cudnn, "op bhsd": lambda: attention(q, k, v, is_causal=causal)}
    variants = [("user bshd", contextlib.nullcontext)]
    if causal:
        variants.append(("user bshd, in launch order", launch_order))
    variants.append(("user bshd, mask before gemm", mask_before_gemm))
    for label, patch in variants:
        with patch():
            bshd = pc.load("tilews", "flash_attention", "example_mha_fwd_bshd.py").flashattn(
                batch, heads, seq, dim, causal, **BLOCKS)
        out[label] = lambda kern=bshd: kern(q_s, k_s, v_s).transpose(1, 2)
        order = [n for n in bshd.report.notes if n.startswith("longest_first")]
        after = any(n.startswith("mask_after_gemm") for n in bshd.report.notes)
        print(f"{label}: {bshd.report.backend}; {order[0] if order else 'launch order'}; "
              f"mask {'after' if after else 'before'} the gemm")
    bhsd = pc.load("tilews", "flash_attention", "example_mha_fwd_bhsd.py").flashattn(
        batch, heads, seq, seq, dim, causal, **BLOCKS)
    out["user bhsd"] = lambda: bhsd(q, k, v)
    torch.cuda.synchronize()
    return out


def run_case(name, rounds):
    import torch
    dim, causal = CASES[name]
    batch, heads, seq = SHAPES[dim]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    runs = kernels(dim, causal, q, k, v)
    want = runs["SDPA cuDNN"]().float()
    row = {"case": name, "shape": [batch, heads, seq, dim], "causal": causal, "rows": {}}
    for label, fn in runs.items():
        err = float((fn().float() - want).abs().max() / want.abs().max())
        row["rows"][label] = {"rel_err_vs_cudnn": err, "ms": []}
    for _ in range(rounds):
        for label, fn in runs.items():
            row["rows"][label]["ms"].append(pc.launches_ms(fn))
    base = row["rows"]["SDPA cuDNN"]["ms"]
    for label, r in row["rows"].items():
        ratios = [b / t for b, t in zip(base, r["ms"])]
        r.update(median_ms=statistics.median(r["ms"]), vs_cudnn=statistics.median(ratios),
                 spread=[min(ratios), max(ratios)])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("probe_user_attention needs a CUDA GPU")
    rows = []
    for name in opts.cases.split(","):
        print(f"== {name}", flush=True)
        rows.append(run_case(name, opts.rounds))
    out = pathlib.Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_user_attention.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "rounds": opts.rounds, "rows": rows}, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, {opts.rounds} interleaved rounds; "
          f"vs cuDNN = cuDNN time / time (> 1: faster)")
    print(f"{'case':12} {'row':28} {'ms':>8} {'vs cuDNN':>9} {'spread':>11} {'err':>8}")
    for row in rows:
        for label, r in row["rows"].items():
            print(f"{row['case']:12} {label:28} {r['median_ms']:8.4f} {r['vs_cudnn']:9.3f} "
                  f"{r['spread'][0]:5.2f}-{r['spread'][1]:.2f} {r['rel_err_vs_cudnn']:8.1e}")


if __name__ == "__main__":
    main()
