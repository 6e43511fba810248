"""Check and time attention forward (tilews.ops.attention's program, and the explicit T.ws one)
against SDPA with the cuDNN and flash backends, interleaved over several rounds, plus the fused
GEMM epilogue against torch.matmul followed by the same epilogue; median ratio per row with its
spread. Writes JSON to $OUT/attention.json when $OUT is set.

    python scripts/tune_attention.py [--rounds N] [--quick] [--auto-only] [--dim D]
                                     [--blocks 'BMxBN tT sS;...'] [--target 'FIELD=on|off|N;...']

--quick: the D=128 shapes and one epilogue shape; --auto-only: only tilews.ops.attention's
program (the default schedule) against the references, no epilogue rows; --dim D: only the
shapes of head dim D; --blocks: the automatic program also with these blocks, consumer threads
and K/V stages (e.g. '192x128 t384 s2': three consumer warp groups); --target: the automatic
program also compiled with each of these Hopper target fields set (e.g.
'pingpong=on;overlap_softmax=off;num_sms=0' (0: not persistent); default: overlap_softmax=off,
none with --auto-only), launched directly (host time differs: compare kernels of more than
~0.1 ms).
"""
from __future__ import annotations

import json
import os
import re
import pathlib
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tilews
import tilews.language as T
from examples.attention import ws_mha_fwd_program
from tilews.ops.attention import mha_fwd_program
from tilews.ops.epilogue import matmul_epilogue
from tilews.lowering.frontend import build_kernel
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.testing import rel_err, time_ms
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/ from any cwd
from tests.helpers import load  # noqa: E402

SHAPES = [  # (B, H, S, D)
    (4, 16, 4096, 128), (2, 16, 8192, 128), (8, 16, 2048, 64), (4, 32, 4096, 64), (2, 16, 1000, 128),
]
hop = lambda f: tilews.jit(out_idx=[-1], target="hopper")(f)  # noqa: E731


def _launch(program, q, k, v):
    out = torch.empty_like(q)
    program.launch([q, k, v, out])
    return out


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def attention_rows(rounds, quick, auto_only=False, dim=None, blocks=(), switches=()):
    rows = []
    target = HOPPER.replace(num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    for B, H, S, D in [s for s in (SHAPES[:2] if quick else SHAPES) if dim in (None, s[3])]:
        for causal in (False, True):
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
            bn, stages = (64, 1) if D > 128 else (128, 2)
            prim = mha_fwd_program(B, H, S, D, causal, block_M=128, block_N=bn, num_stages=stages,
                                   threads=256)
            cands = {"auto": hop(lambda: prim)()}
            for text in blocks:
                bm, bn_, threads, st = (int(v) for v in re.fullmatch(r"(\d+)x(\d+) t(\d+) s(\d+)", text).groups())
                cands[f"auto {text}"] = hop(mha_fwd_program)(B, H, S, D, causal, block_M=bm, block_N=bn_,
                                                             num_stages=st, threads=threads)
            for text, name, value in switches:
                prog = load(build_kernel(prim), "gluon", target.replace(**{name: value}))
                cands[f"auto, {text}"] = lambda q, k, v, p=prog: _launch(p, q, k, v)
            if D <= 128 and not auto_only:
                cands["explicit T.ws"] = hop(ws_mha_fwd_program)(B, H, S, D, causal, block_N=bn, stages=stages)
            checks = {}
            for name, kern in cands.items():
                out = kern(q, k, v)
                again = kern(q, k, v)
                checks[name] = dict(target=getattr(kern, "target", "hopper (gluon, direct)"), err=rel_err(out, ref),
                                    nan=bool(out.isnan().any()), deterministic=bool(torch.equal(out, again)))
            refs = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
            times = {n: [] for n in [*cands, *refs]}
            for _ in range(rounds):
                for n, fn in refs.items():
                    times[n].append(time_ms(lambda: fn(q, k, v, causal), q.device))
                for n, kern in cands.items():
                    times[n].append(time_ms(lambda: kern(q, k, v), q.device))
            for n in cands:
                r_cudnn = [c / t for c, t in zip(times["cudnn"], times[n])]
                r_flash = [c / t for c, t in zip(times["flash"], times[n])]
                med = statistics.median(times[n])
                rows.append(dict(work="attention", shape=f"B{B} H{H} S{S} D{D}", causal=causal, variant=n,
                                 **checks[n], ms=med, tflops=flops / med / 1e9,
                                 cudnn_tflops=flops / statistics.median(times["cudnn"]) / 1e9,
                                 vs_cudnn=statistics.median(r_cudnn), vs_cudnn_min=min(r_cudnn),
                                 vs_cudnn_max=max(r_cudnn), vs_flash=statistics.median(r_flash)))
                print(rows[-1], flush=True)
    return rows


def epilogue_rows(rounds, quick):
    acts = {"relu": torch.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
    rows = []
    for M, N, K in [(4096, 4096, 4096), (8192, 8192, 1024)][:1 if quick else 2]:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        for act, fn in acts.items():
            kern = hop(matmul_epilogue.fn)(M, N, K, act, 0.5, block_M=128, block_N=256, block_K=64,
                                           num_stages=3, threads=256, dtype=T.bfloat16)
            out = kern(a, b, bias)
            exact = fn(0.5 * (a.double() @ b.double()) + bias.double())
            torch_fn = lambda: fn(0.5 * (a @ b) + bias)  # noqa: E731
            err, err_torch = rel_err(out, exact), rel_err(torch_fn(), exact)
            ours, theirs = [], []
            for _ in range(rounds):
                theirs.append(time_ms(torch_fn, a.device))
                ours.append(time_ms(lambda: kern(a, b, bias), a.device))
            r = [t / o for t, o in zip(theirs, ours)]
            rows.append(dict(work="gemm+epilogue", shape=f"{M}x{N}x{K}", activation=act, target=kern.target,
                             err=err, err_torch=err_torch, ms=statistics.median(ours),
                             vs_torch=statistics.median(r), vs_torch_min=min(r), vs_torch_max=max(r)))
            print(rows[-1], flush=True)
    return rows


def _switch(text: str) -> tuple:
    """'FIELD=on|off|N' -> (text, a field of the Hopper backend's config, its value), checked
    before any GPU work."""
    name, _, value = text.partition("=")
    fields = set(HOPPER.field_owners())
    if name not in fields or not (value in ("on", "off") or value.isdigit()):
        raise SystemExit(f"--target: {text!r} is not FIELD=on|off|N with FIELD one of {sorted(fields)}")
    return text, name, int(value) if value.isdigit() else value == "on"


def main(argv) -> int:
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
    quick = "--quick" in argv
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    auto_only = "--auto-only" in argv
    dim = int(argv[argv.index("--dim") + 1]) if "--dim" in argv else None
    blocks = argv[argv.index("--blocks") + 1].split(";") if "--blocks" in argv else ()
    switches = [_switch(t) for t in (argv[argv.index("--target") + 1].split(";") if "--target" in argv
                                     else () if auto_only else ("overlap_softmax=off",))]
    rows = attention_rows(rounds, quick, auto_only, dim, blocks, switches) + (
        [] if auto_only else epilogue_rows(rounds, quick))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "attention.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\nmedian of {rounds} interleaved rounds (ratio > 1: tilews faster)")
    print("| work | shape | causal/act | variant | target | rel err | TFLOP/s | vs cuDNN (min-max) | vs flash |")
    for r in rows:
        if r["work"] == "attention":
            print(f"| attention | {r['shape']} | {r['causal']} | {r['variant']} | {r['target']} | {r['err']:.1e}"
                  f"{' NaN' if r['nan'] else ''}{'' if r['deterministic'] else ' nondet'} | {r['tflops']:.0f} "
                  f"(cuDNN {r['cudnn_tflops']:.0f}) | {r['vs_cudnn']:.3f}x ({r['vs_cudnn_min']:.3f}-"
                  f"{r['vs_cudnn_max']:.3f}) | {r['vs_flash']:.3f}x |")
        else:
            print(f"| gemm+epilogue | {r['shape']} | {r['activation']} | matmul_epilogue | {r['target']} | "
                  f"{r['err']:.1e} (torch {r['err_torch']:.1e}) | | {r['vs_torch']:.3f}x vs torch "
                  f"({r['vs_torch_min']:.3f}-{r['vs_torch_max']:.3f}) | |")
    bad = [r for r in rows if r["err"] > 1e-2 or r.get("nan")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
