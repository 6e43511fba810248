"""Check and time FP8 scaled matmuls (``tilews.ops.fp8_scaled_mm`` and schedule variants of the
``T.fp8_scaled_matmul`` program) against ``torch._scaled_mm``, interleaved over several rounds;
median ratio per row with its spread. Writes JSON to $OUT/fp8.json when $OUT is set.

    python scripts/tune_fp8.py [--rounds N] [--quick] [--modes row,row-fast,tensor,block]
                               [--shapes MxNxK,...] [--panels P,...] [--tiles BMxBNsSTtT,...]
                               [--serial-promotion]

Rows: per granularity (tensor, row, block) and accumulation (fast: one accumulator over all of K;
promoted: FP8 partial sums added into fp32 every 128 of K), the op as users call it and variants
(tile widths and stages, one merged consumer role; ``--panels``: the tile order's panels of P
tile rows; ``--tiles``: tile shapes, e.g. ``64x128s8t128``; each instead of the other variants;
``--serial-promotion``: each unsplit ``--tiles`` tiling of a promoting mode also launched directly
with ``overlap_promotion`` on ("overlapped") and off ("serial": each k-block's promotion after its
wgmma, before the next is issued), timed in the same rounds from a CUDA graph of 50 calls
(``peer_compare.graph_ms``: the direct launch's host path would dominate these short kernels; L2
is not flushed between the calls, so these rows compare with each other, not with the op's or
torch's)).
Tile-hint variants run the op's own kernel (``scaled_mm_kernel`` with ``tiles``), so they time
what a call costs; the merged-role variant needs a Target field and is launched directly (its
host overhead shows at short kernels). References: the
rowwise / tensorwise ``_scaled_mm`` with the same ``use_fast_accum``; block-wise rows compare with
rowwise non-fast ``_scaled_mm`` (the issue's yardstick).
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys

import torch

import tilews.language as T
from tilews.lowering.frontend import build_kernel
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.ops import fp8_scaled_mm
from tilews.bench.fp8 import exact
from tilews.ops.fp8 import Tiles, scaled_mm_kernel, split_scratch, tiled_kernel_mapping
from tilews.testing import rel_err, time_ms
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/ from any cwd
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tests.helpers import load  # noqa: E402
import peer_compare as pc  # noqa: E402

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (128, 4096, 4096),
          (1024, 14336, 4096)]
E4M3 = torch.float8_e4m3fn


def program(M, N, K, sa_shape, sb_shape, fast, **hints):
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float8_e4m3), SA: T.Tensor(sa_shape, T.float32),
             B: T.Tensor((N, K), T.float8_e4m3), SB: T.Tensor(sb_shape, T.float32),
             C: T.Tensor((M, N), T.bfloat16)):
        T.fp8_scaled_matmul(A, SA, B, SB, C, transpose_B=True, use_fast_accum=fast, **hints)
    return main


def direct(prim, target):
    p = load(build_kernel(prim, target="hopper"), "gluon", target)

    def run(a, sa, w, sb):
        out = torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16, device="cuda")
        p.launch([a, sa, w, sb, out])
        return out
    return run


def with_tiles(a, w, sa, sb, fast, hints: tuple, tiles=None):
    """The op's call with the intrinsic's tile hints ``hints`` ((name, value) pairs); ``tiles``:
    the ``Tiles`` they are the ``hints()`` of, where they are (the op's own tilings: swapped ones
    map the operands as the op does, split ones get the op's scratch operands)."""
    args, mapping = tiled_kernel_mapping(tiles, a, w.t(), sa, sb, use_fast_accum=fast)
    operands = mapping(a, w.t(), sa, sb)
    kernel = scaled_mm_kernel(*args, hints)
    scratch = split_scratch(tiles, *args[:2]) or (lambda device: ())
    return lambda: kernel(*operands, *scratch(a.device))


def inputs(M, N, K, gran):
    a = (torch.randn(M, K, device="cuda") * 3).to(E4M3)
    w = (torch.randn(N, K, device="cuda") * 3).to(E4M3)
    kb, nb = -(-K // 128), -(-N // 128)
    if gran == "tensor":
        sa, sb = torch.tensor(0.7, device="cuda"), torch.tensor(1.3, device="cuda")
    elif gran == "row":
        sa, sb = torch.rand(M, 1, device="cuda") + 0.5, torch.rand(1, N, device="cuda") + 0.5
    else:
        sa, sb = torch.rand(M, kb, device="cuda") + 0.5, torch.rand(kb, nb, device="cuda") + 0.5
    return a, w, sa, sb


def torch_block_wise(a, w, sa, sa_m, sb):
    """torch's own block-wise scaled matmul (1x128 blocks of a, 128x128 of b), if this torch and
    GPU have one, with the first scale layouts it accepts; else None (the reason printed)."""
    for name, scale_a in (("row-major", sa), ("M-major", sa_m)):
        for sb_name, scale_b in (("transposed", sb), ("row-major", sb.contiguous())):
            call = lambda scale_a=scale_a, scale_b=scale_b: torch._scaled_mm(  # noqa: E731
                a, w.t(), scale_a, scale_b, out_dtype=torch.bfloat16)
            try:
                call()
            except Exception as e:  # noqa: BLE001  (unsupported layouts are tried in turn)
                print(f"torch block-wise, scale_a {name}, scale_b {sb_name}: "
                      f"{type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            print(f"torch block-wise runs with scale_a {name}, scale_b {sb_name}", flush=True)
            return call
    return None


def rows_for(M, N, K, gran, fast, rounds, quick, panels=(), tiles=(), serial=False):
    a, w, sa, sb = inputs(M, N, K, gran)
    ref = exact(a, w.t(), sa, sb)
    if gran == "block":     # b's scales in torch's layout (the transpose of a contiguous tensor)
        sb = sb.t().contiguous().t()
    torch_gran = "row" if gran == "block" else gran
    ta, tw, tsa, tsb = (a, w, sa, sb) if torch_gran == gran else inputs(M, N, K, "row")
    torch_fast = fast and gran != "block"
    theirs = lambda: torch._scaled_mm(ta, tw.t(), tsa, tsb, out_dtype=torch.bfloat16,  # noqa: E731
                                      use_fast_accum=torch_fast)
    cands = {"op": lambda: fp8_scaled_mm(a, w.t(), sa, sb, use_fast_accum=fast)}
    graphed = set()         # candidates timed from a CUDA graph (their host path is slow)
    sa_m = sa.t().contiguous().t()          # the same scales stored M-major (cuBLAS's layout)
    if gran == "block":
        cands["op, M-major scale_a"] = lambda: fp8_scaled_mm(a, w.t(), sa_m, sb)
        theirs_block = torch_block_wise(a, w, sa, sa_m, sb)
        if theirs_block is not None:
            cands["torch block-wise"] = theirs_block
    # variants: the op's kernel with tile hints (block-wise: M-major A scales, the op's fast form)
    hinted = {f"panel {p}": ((("panel", p),), None) for p in panels}
    tilings = {t: Tiles.from_text(t) for t in tiles}
    hinted.update({t: (tiling.hints(), tiling) for t, tiling in tilings.items()})
    if not quick and not panels and not tiles:
        hinted["panel 8"] = ((("panel", 8),), None)
        hinted["BN 128, 5 stages" if gran == "block" or not fast else "BN 128, 4 stages"] = \
            ((("block_N", 128), ("num_stages", 5 if gran == "block" or not fast else 4)), None)
    for name, (hints, tiling) in hinted.items():
        try:
            cands[name] = with_tiles(a, w, sa_m if gran == "block" else sa, sb, fast, hints, tiling)
        except Exception as e:  # a variant that does not compile is reported, not fatal
            print(f"variant {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    isa, isb = (sa.reshape(1), sb.reshape(1)) if gran == "tensor" else \
        (sa, sb.t() if gran == "block" else sb)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if not quick and not panels and not tiles and (gran == "block" or not fast):   # roles split
        target = HOPPER.replace(num_sms=sms, split_consumers=False)
        run = direct(program(M, N, K, tuple(isa.shape), tuple(isb.shape), fast), target)
        cands["merged"] = lambda: run(a, isa, w, isb)
    for t, tiling in (tilings.items() if serial and (gran == "block" or not fast) else ()):
        if tiling.splits > 1:                                                   # the promotion
            continue
        for name, on in (("overlapped", True), ("serial", False)):
            run = direct(program(M, N, K, tuple(isa.shape), tuple(isb.shape), fast,
                                 **dict(tiling.hints())),
                         HOPPER.replace(num_sms=sms, overlap_promotion=on))
            cands[f"{t} {name} (graph)"] = lambda run=run: run(a, isa, w, isb)
            graphed.add(f"{t} {name} (graph)")
    out = {}
    for name, fn in list(cands.items()):
        try:
            got, again = fn(), fn()
        except Exception as e:  # a variant that does not run is reported, not fatal
            print(f"variant {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            del cands[name]
            continue
        out[name] = dict(err=rel_err(got, ref), nan=bool(got.isnan().any()),
                         deterministic=bool(torch.equal(got, again)))
    err_torch = rel_err(theirs(), exact(ta, tw.t(), tsa, tsb))
    times = {n: [] for n in [*cands, "torch"]}
    for r in range(rounds):
        order = ["torch", *cands] if r % 2 == 0 else [*cands, "torch"]
        for n in order:
            if n in graphed:
                times[n].append(pc.graph_ms(cands[n]))
            else:
                times[n].append(time_ms(theirs if n == "torch" else cands[n], a.device))
    flops = 2.0 * M * N * K
    rows = []
    for n in cands:
        ratio = [t / o for t, o in zip(times["torch"], times[n])]
        med = statistics.median(times[n])
        rows.append(dict(shape=f"{M}x{N}x{K}", gran=gran, fast=fast, variant=n, **out[n], err_torch=err_torch,
                         ms=med, tflops=flops / med / 1e9,
                         torch_tflops=flops / statistics.median(times["torch"]) / 1e9,
                         vs_torch=statistics.median(ratio), vs_min=min(ratio), vs_max=max(ratio),
                         torch_ref=f"{torch_gran}{' fast' if torch_fast else ''}"))
        print(rows[-1], flush=True)
    return rows


def main(argv) -> int:
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
    quick = "--quick" in argv
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = []
    modes = {"row": ("row", False), "row-fast": ("row", True), "tensor": ("tensor", False),
             "block": ("block", False)}
    chosen = argv[argv.index("--modes") + 1].split(",") if "--modes" in argv else list(modes)
    panels = [int(p) for p in argv[argv.index("--panels") + 1].split(",")] if "--panels" in argv else []
    tiles = argv[argv.index("--tiles") + 1].split(",") if "--tiles" in argv else []
    serial = "--serial-promotion" in argv
    shapes = [tuple(int(d) for d in s.split("x")) for s in argv[argv.index("--shapes") + 1].split(",")] \
        if "--shapes" in argv else SHAPES[:2] if quick else SHAPES
    cases = [(s, *modes[m]) for s in shapes for m in chosen]
    for (M, N, K), gran, fast in cases:
        rows += rows_for(M, N, K, gran, fast, rounds, quick, panels, tiles, serial)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fp8.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\nmedian of {rounds} interleaved rounds (ratio > 1: tilews faster)")
    print("| shape | scales | accum | variant | rel err (torch) | TFLOP/s | torch ref | vs torch (min-max) |")
    for r in rows:
        print(f"| {r['shape']} | {r['gran']} | {'fast' if r['fast'] else 'promoted'} | {r['variant']} | "
              f"{r['err']:.1e}{' NaN' if r['nan'] else ''}{'' if r['deterministic'] else ' nondet'} "
              f"({r['err_torch']:.1e}) | {r['tflops']:.0f} (torch {r['torch_tflops']:.0f}) | {r['torch_ref']} | "
              f"{r['vs_torch']:.3f}x ({r['vs_min']:.3f}-{r['vs_max']:.3f}) |")
    bad = [r for r in rows if r["err"] > 2e-2 or r["nan"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
