"""MLA decode and varlen GQA decode (TileLang's examples, as ``peer_compare.py`` builds them):
tilews under the compiler's former and present schedule decisions, beside TileLang 0.1.15, timed
in interleaved rounds in one process on one GPU.

    python scripts/probe_decode_schedules.py [--rounds 5] [--cases mla_decode,gqa_decode_varlen]

The former decisions are restored by patching the pass that made them, only while that variant
is lowered (each variant loads its own copy of the example, and the disk cache is off, so no
variant reuses another's kernel):

* ``mla_decode``: ``overlap_mma`` on a 2-stage ring (``MIN_STAGES = 2``, as before) or left
  alone (3, now).
* ``gqa_decode_varlen``: persistent (``persist`` blind to the runtime trip count, as before) or
  one block per tile (now); each with the example's ``num_stages=1`` and with 2 (a deeper ring,
  the program's own parameter).

Each variant is checked against the float32 torch reference of ``peer_compare.py``. The table
gives each one's median time and its median ratio to TileLang's (< 1: tilews faster).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys

os.environ["TILEWS_DISABLE_CACHE"] = "1"    # the disk cache's key does not see the patches

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_compare as pc  # noqa: E402


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def variants(case):
    from tilews.lowering.passes import overlap_mma, persist
    if case == "mla_decode":
        return [("overlap_mma at 2 stages (before)", lambda: patched(overlap_mma, "MIN_STAGES", 2), {}),
                ("overlap_mma from 3 stages (now)", contextlib.nullcontext, {})]
    blind = lambda: patched(persist, "_trips_read_from_memory", lambda kernel: None)  # noqa: E731
    return [("persistent, 1 stage (before)", blind, {}),
            ("block per tile, 1 stage (now)", contextlib.nullcontext, {}),
            ("persistent, 2 stages", blind, {"num_stages": 2}),
            ("block per tile, 2 stages", contextlib.nullcontext, {"num_stages": 2})]


def run_case(case, rounds, chosen=None):
    """Time ``chosen`` (label, patch, factory kwargs) variants of ``case``, default ``variants``'s,
    beside TileLang; print the table."""
    import torch
    folder, file, build, inputs, reference, _ = pc.CASES[case]()
    kernels = {}
    for label, patch, extra in chosen or variants(case):
        mod = pc.load("tilews", folder, file)
        factory = mod.flashattn
        if extra:
            real = factory
            factory = lambda *a, _r=real, _e=extra: _r(*a, **_e)  # noqa: E731
            mod.flashattn = factory
        with patch():
            try:
                kernels[label] = build(mod)
            except Exception as e:      # noqa: BLE001 - reported
                print(f"{label}: {type(e).__name__}: {str(e)[:300]}")
    try:
        kernels["TileLang"] = build(pc.load("original", folder, file))
    except Exception as e:              # noqa: BLE001
        print(f"TileLang: {type(e).__name__}: {str(e)[:300]}")
    args = inputs()
    want = [w.float() for w in reference(*args)]
    for label, k in list(kernels.items()):
        try:
            got = [g.float() for g in pc.as_list(k(*args))][:len(want)]
            err = max(float((g - w).abs().max() / w.abs().max().clamp_min(1e-6)) for g, w in zip(got, want))
            print(f"{case} / {label}: rel err {err:.1e}", flush=True)
        except Exception as e:          # noqa: BLE001
            print(f"{case} / {label}: {type(e).__name__}: {str(e)[:300]}")
            del kernels[label]
    times = {lb: [] for lb in kernels}
    for _ in range(rounds):
        for lb, k in kernels.items():
            times[lb].append(pc.launches_ms(lambda: k(*args)))
        torch.cuda.synchronize()
    print(f"\n{case}: {torch.cuda.get_device_name()}, {rounds} interleaved rounds")
    for lb, ts in times.items():
        ratio = ""
        if "TileLang" in times and lb != "TileLang":
            rs = [a / b for a, b in zip(ts, times["TileLang"])]
            ratio = f"{statistics.median(rs):.3f} ({min(rs):.2f}-{max(rs):.2f})"
        print(f"  {lb:40} {statistics.median(ts):.4f} ms  {ratio}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="mla_decode,gqa_decode_varlen")
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    pc.unpack_peers()
    for case in opts.cases.split(","):
        run_case(case, opts.rounds)


if __name__ == "__main__":
    main()
