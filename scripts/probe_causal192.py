"""Attention with a causal mask (TileLang's example_mha_fwd_bshd.py, as peer_compare.py builds it,
D192 and D128 causal, D192 not): tilews with and without the ``uniform_selects`` pass, beside
TileLang 0.1.15, timed in interleaved rounds in one process on one GPU.

    python scripts/probe_causal192.py [--rounds 7]

Without the pass (the Gluon pipeline less it, only while that variant is lowered; the disk cache
is off) the example's mask is computed element by element on every key block. Each variant is
checked against peer_compare's float32 reference; the table gives each one's median time and its
median ratio to TileLang's (< 1: tilews faster).
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_compare as pc  # noqa: E402
import probe_decode_schedules as probe  # noqa: E402  (turns the disk cache off)


def main():
    from tilews.triton_ext.gluon.backend import GluonBackend
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    opts = ap.parse_args()
    pc.unpack_peers()
    pc.CASES["attention_d128_causal"] = lambda: pc._attention(128, True)
    before = lambda: probe.patched(GluonBackend, "pipeline",  # noqa: E731
                                   GluonBackend.pipeline.without("uniform_selects"))
    for case in ("attention_d192_causal", "attention_d128_causal", "attention_d192"):
        probe.run_case(case, opts.rounds, [("mask on every block (before)", before, {}),
                                           ("uniform_selects (now)", contextlib.nullcontext, {})])


if __name__ == "__main__":
    main()
