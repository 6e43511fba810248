"""``tilews.ops.decode_attention`` (GQA) under other split counts, K/V ring depths and K/V block
sizes than its heuristic's, in both forms of its combine (``fused``: the split kernel's last
block of a row tile merges it; ``2k``: a second kernel), beside SDPA's backends, timed in
interleaved rounds on one GPU (issue 40: decode at batch 1-8 is short of SDPA's best backend).

    python scripts/probe_decode_splits.py [--rounds 5] [--shapes 1x32x8x8192x128,8x32x8x8192x128]

The batch-1 sweep (issue 40: GPU time 0.95x cuDNN's at B1 x 8192): the GPU time alone, three
rings, three shapes so a change of ``choose_num_splits`` can be judged at 32k keys and batch 8
too; 44 compiles, about 2-3 minutes on an H200 from a cold cache:

    python scripts/probe_decode_splits.py --graphs-only --rounds 5 --rings 128x2,64x2,64x4 \
        --shapes 1x32x8x8192x128,1x32x8x32768x128,8x32x8x8192x128

Per shape (B x H x KVH x S x D, one query token, fp16): the split counts around the heuristic's
(``choose_num_splits``: half, itself, twice, four times; within 1..64; ``--splits`` names
them instead) under each of ``RINGS`` (K/V block, stages; ``--rings`` names them), fused, and at the op's own ring also in the two-kernel form (more than one
split) — the op's own blocks and form (``blocks``, ``fuses_combine``) are patched for the
duration of that variant's first call, its kept calls cleared — and SDPA's cuDNN, flash and
efficient backends where they take the shape. Each row's time both as launched (CUDA events
around back-to-back calls: host cost included; a tilews row is the op's kept call, without the
public call's key lookup) and from a CUDA graph of 50 calls (the GPU's time alone; ``--graphs-only``: that column alone); the ratio is
the best SDPA backend's time over the row's, per round, median (min..max) (> 1: faster). Every
tilews row is checked against SDPA's output first. JSON: ``$OUT/probe_decode_splits.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_compare as pc  # noqa: E402

RINGS = ((128, 2), (128, 3), (64, 4))        # (block_N, num_stages); the op's own is (128, 2)
SHAPES = "1x32x8x8192x128,8x32x8x8192x128,1x64x8x32768x128"


def variants(B, H, KVH, S, D, q, k, v, rings=RINGS, counts=None):
    """label -> zero-argument call, built (compiled) here: ``counts`` splits (default: around
    the heuristic's) under each ring of ``rings``."""
    import torch
    from tilews import num_sms
    from tilews.ops import decode as dec
    own = dec.blocks(D, True)
    heuristic = dec.choose_num_splits(B * KVH, S, own["block_N"], num_sms())
    out = {}
    if counts is None:
        counts = sorted({max(1, heuristic // 2), heuristic, min(64, 2 * heuristic), min(64, 4 * heuristic)})
    for block_N, stages in rings:
        tiles = dict(own, block_N=block_N, num_stages=stages)
        ring = (block_N, stages) == (own["block_N"], own["num_stages"])
        for splits in counts:
            for fused in (True, False) if ring and splits > 1 else (True,):
                real = dec.blocks, dec.fuses_combine
                dec.blocks = lambda dim, gpu, tiles=tiles: dict(tiles)
                dec.fuses_combine = lambda target, fused=fused: fused
                dec._calls.clear()
                try:
                    dec.decode_attention(q, k, v, num_splits=splits)
                    call = dec._calls.copy()
                finally:
                    dec.blocks, dec.fuses_combine = real
                (kept,) = call.values()
                mark = "*" if ring and splits == heuristic and fused else ""
                form = "fused" if fused else "2k"
                out[f"tilews N{block_N} s{stages} x{splits} {form}{mark}"] = lambda kept=kept: kept(q, k, v, None, None)
    dec._calls.clear()
    torch.cuda.synchronize()
    return out


def sdpa(q, k, v, H, KVH):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = {}
    for name, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION),
                          ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=KVH != H).transpose(1, 2)
        try:
            run()
        except RuntimeError as e:
            print(f"{name}: does not take the shape ({str(e).splitlines()[0][:100]})")
            continue
        out[name] = run
    torch.cuda.synchronize()
    return out


def run_shape(text, rounds, rings=RINGS, counts=None, graphs_only=False):
    import torch
    B, H, KVH, S, D = (int(x) for x in text.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(B, S, KVH, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    refs = sdpa(q, k, v, H, KVH)
    runs = {**refs, **variants(B, H, KVH, S, D, q, k, v, rings, counts)}
    want = next(iter(refs.values()))().float()
    rows = {label: {"rel_err": float((fn().float() - want).abs().max() / want.abs().max()),
                    "launched_ms": [], "graph_ms": []} for label, fn in runs.items()}
    for _ in range(rounds):
        for label, fn in runs.items():
            if not graphs_only:
                rows[label]["launched_ms"].append(pc.launches_ms(fn))
            rows[label]["graph_ms"].append(pc.graph_ms(fn))
    for how in ("graph_ms",) if graphs_only else ("launched_ms", "graph_ms"):
        best = [min(rows[r][how][i] for r in refs) for i in range(rounds)]
        for r in rows.values():
            ratios = [b / t for b, t in zip(best, r[how])]
            r[how.replace("ms", "vs_best_sdpa")] = [statistics.median(ratios), min(ratios), max(ratios)]
    return {"shape": text, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rings", help="K/V block x stages, e.g. 128x2,64x4 (default: RINGS)")
    ap.add_argument("--splits", help="split counts, e.g. 8,16,32 (default: around the heuristic's)")
    ap.add_argument("--graphs-only", action="store_true", help="time from CUDA graphs only")
    args = ap.parse_args()
    rings = RINGS if not args.rings else tuple(tuple(int(x) for x in r.split("x")) for r in args.rings.split(","))
    counts = None if not args.splits else sorted({int(x) for x in args.splits.split(",")})
    import torch
    print(f"device: {torch.cuda.get_device_name()}")
    results = []
    for text in args.shapes.split(","):
        results.append(run_shape(text, args.rounds, rings, counts, args.graphs_only))
        out = pathlib.Path(os.environ.get("OUT", "/tmp/out"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "probe_decode_splits.json").write_text(json.dumps(results, indent=1))
    for res in results:
        print(f"\n{res['shape']}  (* = the op's choice; ratio: best SDPA time / this, > 1 faster)")
        print(f"{'row':34} {'err':>8} {'launched us':>12} {'ratio':>18} {'graph us':>10} {'ratio':>18}")
        for label, r in res["rows"].items():
            gr = r["graph_vs_best_sdpa"]
            if r["launched_ms"]:
                la = r["launched_vs_best_sdpa"]
                launched = (f"{1e3 * statistics.median(r['launched_ms']):12.1f} "
                            f"{la[0]:6.2f} ({la[1]:.2f}..{la[2]:.2f})")
            else:
                launched = f"{'-':>12} {'-':>18}"
            print(f"{label:34} {r['rel_err']:8.1e} {launched} {1e3 * statistics.median(r['graph_ms']):10.1f} "
                  f"{gr[0]:6.2f} ({gr[1]:.2f}..{gr[2]:.2f})")


if __name__ == "__main__":
    main()
