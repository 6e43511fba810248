"""Attention backward on a GPU: ``tilews.ops.attention``'s backward (its three kernels, and the
main kernel alone at several block choices) beside SDPA's cuDNN and flash backward, interleaved
rounds, median times and ratios (min-max).

    TILEWS_DEVICE_CMD='python scripts/probe_attention_backward.py --rounds 7' bash scripts/device_run.sh

The op's D64 consumer is split into one role per warp group with its own dQ partial
(``split_partials``, on); ``--quick`` times it beside the one-role consumer, the summed partials
(``sum_partials``) and 3 stages (D128: without the dQ reducer warp, in turns, unmerged
releases), GPU time (``--gpu-time``:
each call's kernels under ``torch.profiler``), about 3 minutes:

    TILEWS_DEVICE_CMD='timeout 300 python scripts/probe_attention_backward.py --quick --gpu-time --rounds 5 --only 2 3 --json $OUT/bwd_split.json' bash scripts/device_run.sh

The split tail (``--tail``: non-causal, the main kernel's last wave at most half full split into
parts, ``tail_split``): the op's backward with and without it beside cuDNN's, GPU time, rounds
in alternating order, gradients checked against the unsplit op's (under 240 s):

    TILEWS_DEVICE_CMD='timeout 240 python scripts/probe_attention_backward.py --tail --gpu-time --rounds 5 --only 0 2 --json ${OUT:-/tmp}/tail_split.json' bash scripts/device_run.sh

Each shape's gradients are checked first: tilews's against cuDNN's on the same inputs (relative
Frobenius error of dq, dk, dv), and, on a reduced shape, against a float64 reference. A variant
that fails to build or to agree is reported and left out of the timing. ``--json PATH`` writes
every time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_compare as pc  # noqa: E402

SHAPES = [(4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True), (8, 16, 16, 4096, 64, False),
          (8, 16, 16, 4096, 64, True), (4, 32, 8, 4096, 128, True), (2, 16, 16, 8192, 128, True),
          (8, 16, 16, 4096, 96, False), (8, 16, 16, 4096, 192, False)]
# the main kernel timed alone beside the op: at the op's blocks (``blocks``), and changed by each
# of these ("overlap_gemms" / "merge_releases" / "split_partials" / "sum_partials": compiled with
# TILEWS_OVERLAP_GEMMS / TILEWS_MERGE_RELEASES=off, TILEWS_SPLIT_PARTIALS / TILEWS_SUM_PARTIALS=on,
# each variant by a factory of its own, whose memo of calls does not hold the op's kernel;
# "dq_tile_add": None flips the op's choice; "defer_dq": the previous query block's dQ added under
# this one's first gemms; D128 spills 224-396 B that way; "split_partials": one role per consumer
# warp group, each with its own 64 keys and dQ partial, reduce-added twice (D128 keeps one role:
# its partial would not fit the registers); "sum_partials": the second role hands its partial to
# the first through shared memory, one reduce-add of the sum; "take_turns": D128's warp groups as
# two roles that compute dQ over all 128 keys in turns, TILEWS_TAKE_TURNS=on; "reduce_role": False
# leaves dQ's reduce-adds to the merged consumer, TILEWS_REDUCE_ROLE=off).
# Compile-only (sm_90a, D64): 128 x 128 spills 160 B and serializes its wgmmas (ptxas C7512),
# 64 x 128 spills 96 B: not timed.
# The op's main kernel is the first row (split_partials on: D64 split, D128 one role).
ONE_ROLE = dict(split_partials=False)
SUMMED = dict(sum_partials=True)
MAIN_CHANGES = {64: [ONE_ROLE, SUMMED, dict(num_stages=3), dict(ONE_ROLE, num_stages=3),
                     dict(merge_releases=False), dict(ONE_ROLE, defer_dq=True),
                     dict(ONE_ROLE, defer_dq=True, num_stages=3), dict(block_M=64, threads=128)],
                128: [dict(reduce_role=False), dict(take_turns=True), dict(merge_releases=False),
                      dict(num_stages=3),
                      dict(defer_dq=True),
                      dict(overlap_gemms=False), dict(dq_tile_add=None)]}
# --quick: the changes timed (the op's rival schedules), by head dim
QUICK_CHANGES = {64: MAIN_CHANGES[64][:4], 128: MAIN_CHANGES[128][:3]}
# the preprocess's and postprocess's (rows per block, threads); the op's first
PREPOST_BLOCKS = ((64, 128), (128, 128), (128, 256))
FORWARD_SHAPES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (8, 16, 4096, 64, False),
                  (8, 16, 4096, 64, True)]


def schedule_switches(overlap_gemms: bool, merge_releases: bool, split_partials: bool = True,
                      sum_partials: bool = False, take_turns: bool = False, reduce_role: bool = True):
    """Compiles inside use TILEWS_OVERLAP_GEMMS, TILEWS_MERGE_RELEASES, TILEWS_SPLIT_PARTIALS,
    TILEWS_SUM_PARTIALS, TILEWS_TAKE_TURNS and TILEWS_REDUCE_ROLE on/off (a factory's memo of
    calls does not see them: compile with a fresh one)."""
    onoff = lambda flag: "on" if flag else "off"  # noqa: E731
    return mock.patch.dict(os.environ, TILEWS_OVERLAP_GEMMS=onoff(overlap_gemms),
                           TILEWS_MERGE_RELEASES=onoff(merge_releases),
                           TILEWS_SPLIT_PARTIALS=onoff(split_partials),
                           TILEWS_SUM_PARTIALS=onoff(sum_partials),
                           TILEWS_TAKE_TURNS=onoff(take_turns),
                           TILEWS_REDUCE_ROLE=onoff(reduce_role))


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def check_small(torch, attention, D, causal, group):
    """dq, dk, dv of a reduced shape against float64 (relative Frobenius errors)."""
    B, H, S = 1, 4, 1000
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(B, H, S, D, device="cuda", generator=g).half().requires_grad_()
    k, v = (torch.randn(B, max(1, H // group), S, D, device="cuda", generator=g).half().requires_grad_()
            for _ in range(2))
    do = torch.randn_like(q)
    out = attention(q, k, v, is_causal=causal)
    got = torch.autograd.grad(out, (q, k, v), do)
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    rep = H // kk.shape[1]
    ref = torch.nn.functional.scaled_dot_product_attention(
        qq, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1), is_causal=causal)
    want = torch.autograd.grad(ref, (qq, kk, vv), do.double())
    return [rel(a, b) for a, b in zip(got, want)]


def run_shape(shape, rounds, results, quick=False, timer=pc.launches_ms):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import tilews
    import tilews.language as T
    from tilews.ops import attention
    from tilews.ops.attention_backward import blocks, bwd_program, kernels
    from tilews.ops.attention import _forward
    B, H, KV, S, D, causal = shape
    name = f"B{B} H{H}/{KV} S{S} D{D} {'causal' if causal else 'full'}"
    flops = 10.0 * B * H * S * S * D / (2 if causal else 1)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", generator=g).half().requires_grad_()
    k, v = (torch.randn(B, KV, S, D, device="cuda", generator=g).half().requires_grad_() for _ in range(2))
    do = torch.randn_like(q)
    print(f"\n== {name}: small-shape errors vs float64 (dq, dk, dv):",
          ["%.1e" % e for e in check_small(torch, attention, D, causal, H // KV)], flush=True)

    impls, grads = {}, {}
    for label, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                       enable_gqa=KV != H)
                grads[label] = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

            def run(out=out, backend=backend):
                with sdpa_kernel(backend):
                    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            impls[label] = run
        except Exception as e:          # noqa: BLE001 - reported
            print(f"{label}: unavailable: {type(e).__name__}: {str(e)[:200]}")
    t0 = time.time()
    out = attention(q, k, v, is_causal=causal)
    grads["tilews"] = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    print(f"tilews: first forward + backward (compiles) {time.time() - t0:.1f} s")
    impls["tilews"] = lambda out=out: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    ref = grads.get("SDPA cuDNN") or grads.get("SDPA flash")
    if ref is not None:
        print("tilews vs", "cuDNN" if "SDPA cuDNN" in grads else "flash", "(dq, dk, dv):",
              ["%.1e" % rel(a, b) for a, b in zip(grads["tilews"], ref)])

    # the main kernel alone, at the blocks the op uses and the others
    _, lse = _forward(q.detach(), k.detach(), v.detach(), causal, "bhsd", store_lse=True)
    rows = lse.shape[-1]
    delta = torch.empty(lse.shape, device="cuda")
    dq_acc = torch.empty((B, H, rows, D), device="cuda")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    kernels()[0](B, H, S, D, rows, dtype=T.float16)(out.detach(), do, delta, dq_acc)
    op = blocks(D, True)
    split_mains = {}
    for change in [{}] + (QUICK_CHANGES if quick else MAIN_CHANGES).get(D, []):
        cfg = dict(op, **change)
        if "dq_tile_add" in change:
            cfg["dq_tile_add"] = not op.get("dq_tile_add", False)
        on, merge = cfg.pop("overlap_gemms", True), cfg.pop("merge_releases", True)
        split, summed = cfg.pop("split_partials", True), cfg.pop("sum_partials", False)
        turns, reducer = cfg.pop("take_turns", False), cfg.pop("reduce_role", True)
        label = "main " + "x".join(str(cfg[x]) for x in ("block_M", "block_N", "threads", "num_stages")) \
            + (" dQ tile" if cfg.get("dq_tile_add") else "") \
            + (" deferred" if cfg.get("defer_dq") else "") + ("" if on else " gemms off") \
            + ("" if merge else " unmerged") + ("" if split else " one role") + (" summed" if summed else "") \
            + (" turns" if turns else "") + ("" if reducer else " no reducer")
        try:
            with schedule_switches(on, merge, split, summed, turns, reducer):
                kern = tilews.jit()(bwd_program)(B, H, KV, S, D, causal, rows, dtype=T.float16, **cfg)
            wanted = ["each adds its own partial"] * (split and D == 64) + \
                ["sum_partials: T.ws(2) hand"] * summed + ["take_turns: T.ws(1) and T.ws(2)"] * turns
            if not all(any(w in n for n in kern.report.notes) for w in wanted):
                print(f"{label}: not built as asked: "
                      f"{[n for n in kern.report.notes if n.startswith(('split_consumers', 'sum_partials'))]}")
                continue
            args = (q.detach(), k.detach(), v.detach(), do, lse, delta, dq_acc, dk, dv)
            dq_acc.zero_()
            kern(*args)
            # each variant's gradients against the op's (dQ from its zeroed accumulator)
            errs = [rel(a, b) for a, b in zip((dq_acc[:, :, :S], dk, dv), grads["tilews"])]
            if max(errs) > 1e-2:
                print(f"{label}: disagrees with the op (dq, dk, dv {['%.1e' % e for e in errs]}): "
                      f"not timed")
                continue
            impls[label] = lambda kern=kern, args=args: kern(*args)
            print(f"{label}: {kern.kernels[0].report.backend if hasattr(kern, 'kernels') else ''}")
            if ("split_partials" in change or summed) and "num_stages" not in change and "defer_dq" not in change:
                split_mains[f"tilews{'' if split else ' one role'}{' summed' if summed else ''} (3 kernels)"] = kern
        except Exception as e:          # noqa: BLE001
            print(f"{label}: {type(e).__name__}: {str(e)[:300]}")

    if split_mains:
        # the whole backward as the op would run it with each split main kernel, beside the op's
        mains = {"tilews (3 kernels)": kernels()[1](B, H, KV, S, D, causal, rows, dtype=T.float16, **op),
                 **split_mains}
        three_kernels(torch, T, kernels(), mains, (B, H, S, D, rows),
                      (q.detach(), k.detach(), v.detach(), do, out.detach(), lse), grads["tilews"], impls)

    # the preprocess and postprocess alone (--quick too: with the main kernel they account for
    # the op's time), at the op's blocks (64 x 128 threads) and, not --quick, larger ones, beside
    # a memset of dQ's float32 accumulator (what the preprocess's zeroing alone would cost)
    pre, _, post = kernels()
    out_d, dq = out.detach(), torch.empty_like(q)
    for block, threads in PREPOST_BLOCKS[:1] if quick else PREPOST_BLOCKS:
        try:
            p = pre(B, H, S, D, rows, block=block, threads=threads, dtype=T.float16)
            o = post(B, H, S, D, rows, block=block, threads=threads, dtype=T.float16)
            impls[f"pre {block}x{threads}"] = lambda p=p: p(out_d, do, delta, dq_acc)
            impls[f"post {block}x{threads}"] = lambda o=o: o(dq_acc, dq)
        except Exception as e:          # noqa: BLE001
            print(f"pre/post {block}x{threads}: {type(e).__name__}: {str(e)[:300]}")
    impls["dQ acc memset"] = dq_acc.zero_

    _time(torch, name, impls, rounds, flops, results, timer)


def run_tail(shape, rounds, results, timer=pc.launches_ms):
    """``attention_backward`` with its split tail (the op's choice) and without
    (``split_tail=False``), beside SDPA cuDNN's backward; the split's gradients against the
    unsplit op's (and, through the op's autograd at a reduced shape, float64's)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tilews.ops.attention import _forward
    from tilews.ops.attention_backward import attention_backward, blocks, op_tail_split, units_and_trips
    from tilews.ops import attention
    B, H, KV, S, D, causal = shape
    name = f"B{B} H{H}/{KV} S{S} D{D} {'causal' if causal else 'full'}"
    flops = 10.0 * B * H * S * S * D / (2 if causal else 1)
    cfg = blocks(D, True)
    units, _ = units_and_trips(B, H, KV, S, cfg["block_M"], cfg["block_N"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split = op_tail_split(B, H, KV, S, D, causal, cfg, sms)
    print(f"\n== {name}: {units} units on {sms} SMs, the op's split (tail_units, tail_parts) = "
          f"{split}{'' if split[0] else ' (none: split and unsplit time one kernel)'}; "
          f"small-shape errors vs float64 (dq, dk, dv):",
          ["%.1e" % e for e in check_small(torch, attention, D, causal, H // KV)], flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", generator=g).half().requires_grad_()
    k, v = (torch.randn(B, KV, S, D, device="cuda", generator=g).half().requires_grad_() for _ in range(2))
    do = torch.randn_like(q)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=KV != H)
    cudnn = torch.autograd.grad(ref, (q, k, v), do, retain_graph=True)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out, lse = _forward(qd, kd, vd, causal, "bhsd", store_lse=True)
    impls = {}

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.autograd.grad(ref, (q, k, v), do, retain_graph=True)
    impls["SDPA cuDNN"] = sdpa
    grads = {}
    for label, split in (("tilews split", True), ("tilews unsplit", False)):
        def run(split=split):
            return attention_backward(do, qd, kd, vd, out, lse, causal, "bhsd", split_tail=split)
        grads[label] = run()
        impls[label] = run
    print("split vs unsplit (dq, dk, dv):",
          ["%.1e" % rel(a, b) for a, b in zip(grads["tilews split"], grads["tilews unsplit"])],
          "; split vs cuDNN:", ["%.1e" % rel(a, b) for a, b in zip(grads["tilews split"], cudnn)])
    errs = [rel(a, b) for a, b in zip(grads["tilews split"], grads["tilews unsplit"])]
    if max(errs) > 1e-2:
        print("tilews split: disagrees with the unsplit op: not timed")
        del impls["tilews split"]
    _time(torch, name, impls, rounds, flops, results, timer, alternate=True)
    if "tilews split" in results[name]:
        ratios = [a / b for a, b in zip(results[name]["tilews split"], results[name]["tilews unsplit"])]
        print(f"  split / unsplit (per round): median {statistics.median(ratios):.4f} "
              f"({min(ratios):.4f}-{max(ratios):.4f})")


def three_kernels(torch, T, factories, mains, sizes, tensors, want, impls):
    """The op's three kernels called directly (no autograd), with each of ``mains`` (label ->
    main kernel) in the middle: each one's dq, dk, dv checked against the op's (``want``), then
    added to ``impls`` under its label (the op's own main first: the row to compare with);
    ``factories``: the op's (preprocess, main, postprocess)."""
    B, H, S, D, rows = sizes
    q, k, v, do, out, lse = tensors
    pre, _, post = factories
    pre, post = pre(B, H, S, D, rows, dtype=T.float16), post(B, H, S, D, rows, dtype=T.float16)
    delta = torch.empty(lse.shape, device="cuda")
    dq_acc = torch.empty((B, H, rows, D), device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for label, main in mains.items():
        def run(main=main):
            pre(out, do, delta, dq_acc)
            main(q, k, v, do, lse, delta, dq_acc, dk, dv)
            post(dq_acc, dq)
        for t in (dq, dk, dv):
            t.fill_(float("nan"))
        run()
        errs = [rel(a, b) for a, b in zip((dq, dk, dv), want)]
        if max(errs) > 1e-2:
            print(f"{label}: disagrees with the op (dq, dk, dv {['%.1e' % e for e in errs]}): not timed")
            continue
        impls[label] = run


def run_forward(shape, rounds, results):
    """The forward op's program compiled with overlap_gemms on and off, beside SDPA's cuDNN."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import tilews
    import tilews.language as T
    from tilews.ops.attention import blocks, mha_fwd_program
    B, H, S, D, causal = shape
    name = f"forward B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"
    flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", generator=g).half() for _ in range(3))
    impls = {}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    impls["SDPA cuDNN"] = cudnn
    for on in (True, False):
        with schedule_switches(on, True):
            kern = tilews.jit(out_idx=[3])(mha_fwd_program)(B, H, S, D, causal, dtype=T.float16,
                                                            **blocks(D, True))
        out = kern(q, k, v)
        print(f"{name}: gemms {'on' if on else 'off'}: rel err vs cuDNN {rel(out, ref):.1e}")
        impls[f"tilews gemms {'on' if on else 'off'}"] = lambda kern=kern: kern(q, k, v)
    _time(torch, name, impls, rounds, flops, results)


def _time(torch, name, impls, rounds, flops, results, timer=pc.launches_ms, alternate=False):
    """Interleaved rounds of every implementation (``alternate``: odd rounds in reverse order);
    median times and ratios to cuDNN's. ``timer``: ``pc.launches_ms`` (from the launches: the
    host's latency to the first kernel counts) or ``gpu_time`` (the kernels' GPU time,
    ``torch.profiler``)."""
    times = {lb: [] for lb in impls}
    for r in range(rounds):
        order = list(impls.items())
        for lb, fn in reversed(order) if alternate and r % 2 else order:
            times[lb].append(timer(fn))
    base = "SDPA cuDNN" if "SDPA cuDNN" in times else next(iter(times))
    how = "kernels' GPU time" if timer is gpu_time else "from launches"
    print(f"{name}: {torch.cuda.get_device_name()}, {rounds} rounds ({how}); ratio = time / {base}'s")
    for lb, ts in times.items():
        rs = [a / b for a, b in zip(ts, times[base])]
        med = statistics.median(ts)
        print(f"  {lb:28} {med:8.3f} ms {flops / med / 1e9:7.1f} TFLOP/s  "
              f"{statistics.median(rs):.3f} ({min(rs):.2f}-{max(rs):.2f})", flush=True)
    results[name] = times


def gpu_time(fn, calls: int = 10) -> float:
    """``fn``'s GPU time (ms per call): its kernels' time under ``torch.profiler`` (CUDA activity,
    ``calls`` calls after two warm-up ones), without the host's launch latency or the gaps
    between kernels (``profile_backward_op.py`` reads the same counters)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()
               if e.device_type.name == "CUDA") / calls / 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true",
                        help="the op, its main kernel at the op's blocks and QUICK_CHANGES, its "
                             "preprocess and postprocess at the op's blocks")
    parser.add_argument("--only", type=int, nargs="*", help="indices into SHAPES")
    parser.add_argument("--tail", action="store_true",
                        help="the op's backward with and without its split tail (run_tail)")
    parser.add_argument("--gpu-time", action="store_true",
                        help="each call's kernels' GPU time (torch.profiler; else timed from its launches)")
    parser.add_argument("--forward", type=int, nargs="*", default=[],
                        help="indices into FORWARD_SHAPES: the forward with overlap_gemms on and off")
    args = parser.parse_args()
    results = {}
    for i in args.forward:
        try:
            run_forward(FORWARD_SHAPES[i], args.rounds, results)
        except Exception as e:      # noqa: BLE001
            print(f"forward {FORWARD_SHAPES[i]}: {type(e).__name__}: {str(e)[:500]}")
    for i, shape in enumerate(SHAPES):
        if args.only is None or i in args.only:
            timer = gpu_time if args.gpu_time else pc.launches_ms
            try:
                if args.tail:
                    run_tail(shape, args.rounds, results, timer)
                else:
                    run_shape(shape, args.rounds, results, args.quick, timer)
            except Exception as e:      # noqa: BLE001
                print(f"{shape}: {type(e).__name__}: {str(e)[:500]}")
    summary(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def summary(results: dict) -> None:
    """Last: each timed row's median time over SDPA cuDNN's (per round) for every shape."""
    names = [n for n in results if "SDPA cuDNN" in results[n]]
    if not names:
        return
    rows = list(dict.fromkeys(r for n in names for r in results[n]))
    print("\nmedian time / SDPA cuDNN's (rows x shapes):")
    print(f"  {'':34}" + "".join(f"{' '.join(n.split()[1:]):>26}" for n in names))
    for r in rows:
        cells = []
        for n in names:
            ts, base = results[n].get(r), results[n]["SDPA cuDNN"]
            cells.append(f"{statistics.median(a / b for a, b in zip(ts, base)):26.3f}" if ts else f"{'-':>26}")
        print(f"  {r:34}" + "".join(cells))


if __name__ == "__main__":
    main()
