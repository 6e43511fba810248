"""Cold compile latency of tilews's Hopper GEMM and attention programs, beside Triton's own
``tl.dot`` GEMM and a plain Triton flash-attention forward compiled for the same target in the
same process.

Programs: ``examples/gemm.py``'s ``matmul`` 4096^3 (128x256x64 blocks, 3 stages, 256 threads,
fp16) and ``tilews.ops.attention.mha_fwd_program`` (head dim 128, causal, the op's GPU blocks
``blocks(128, True)``), both for target ``"hopper"``. The reference: a plain ``@triton.jit``
GEMM with ``tl.dot`` (128x256x64 blocks, 3 stages, 8 warps, fp16) built by
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``; attention's floor: a plain
``@triton.jit`` flash-attention forward (D128, causal, 128x128 blocks, 3 stages, 8 warps, the
unmasked key blocks then the diagonal one, as Triton's fused-attention tutorial does it; no warp
specialization) built the same way.

Every measurement is cold: a fresh tilews cache folder (``TILEWS_CACHE_DIR``) and a fresh Triton
cache folder (``TRITON_CACHE_DIR``), and a fresh ``@triton.jit`` object for the reference. The
process's imports (torch, triton, tilews) and first uses are paid once, before the first round (one
unmeasured run of each), on both sides.
Rounds interleave the four measurements (their order rotates from round to round, so a
neighbour's load spreads over all of them); the summary gives each program's median ratio to the
Triton GEMM of the same round, with its spread (min..max over rounds), and attention's to the
Triton attention of the same round.

Default (CPU) mode: the whole path up to the compile-only build, which is all that runs on a
machine without a GPU: the frontend (``build_kernel``), each lowering pass, emitting, and loading
(the Gluon backend's compile for sm_90a). Where that compile runs in this process, Triton's stages
come from ``triton.knobs.compilation.listener``; where it runs in a child process (a tilews that
compiles apart), the child's start-up is measured by a child that only imports what the compile
child imports, and the rest of the load is counted as its ``triton.compile``.

``--gpu`` (an sm_90 GPU): ``tilews.compile(program, target="hopper")`` and its first launch
(synchronized), beside the references' first JIT launches (compile + launch), all cold; the
breakdown is compile vs first launch.

    python scripts/profile_compile.py [--rounds 5] [--json out.json]
    python scripts/profile_compile.py --gpu --rounds 3 --json compile_gpu.json
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import tilews  # noqa: E402
from tilews import backends, pass_config, targets  # noqa: E402
from tilews.cache import DiskCache  # noqa: E402
from tilews.lowering.backend import Services  # noqa: E402
from tilews.lowering.frontend import build_kernel  # noqa: E402
from tilews.lowering.pipeline import lower  # noqa: E402
from tilews.lowering.settings import Settings  # noqa: E402
from tilews.ops.attention import blocks, mha_fwd_program  # noqa: E402

from examples.gemm import matmul  # noqa: E402

M = N = K = 4096
BM, BN, BK, STAGES, WARPS = 128, 256, 64, 3, 8
BATCH, HEADS, SEQ, DIM = 1, 32, 4096, 128
CHILD_IMPORTS = ("import torch, triton; from triton.experimental.gluon._runtime import GluonASTSource; "
                 "from triton.runtime.jit import mangle_type; import tilews.triton_ext.passes")


def _tl_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(1), tl.program_id(0)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b = b_ptr + rk[:, None] * stride_bk + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, tl.cdiv(K, BLOCK_K)):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BLOCK_K
        b += BLOCK_K * stride_bk
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(tl.float16))


def _tl_attention_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, rm, rn, stride_s, lo, hi, qk_scale,
                         BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr):
    k_ptrs += lo * stride_s
    v_ptrs += lo * stride_s
    for start_n in range(lo, hi, BLOCK_N):
        qk = tl.dot(q, tl.load(k_ptrs))
        if DIAGONAL:
            qk = tl.where(rm[:, None] >= start_n + rn[None, :], qk * qk_scale, -float("inf"))
        else:
            qk = qk * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), tl.load(v_ptrs), acc * alpha[:, None])
        m_i = m_new
        k_ptrs += BLOCK_N * stride_s
        v_ptrs += BLOCK_N * stride_s
    return acc, l_i, m_i


def _tl_attention(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, stride_h, stride_s,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * stride_h
    rm = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + rm[:, None] * stride_s + rd[None, :])
    k_ptrs = k_ptr + base + rn[None, :] * stride_s + rd[:, None]
    v_ptrs = v_ptr + base + rn[:, None] * stride_s + rd[None, :]
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    qk_scale = sm_scale * 1.44269504
    acc, l_i, m_i = _attention_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, rm, rn, stride_s,
                                      0, start_m * BLOCK_M, qk_scale, BLOCK_N, False)
    acc, l_i, m_i = _attention_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, rm, rn, stride_s,
                                      start_m * BLOCK_M, (start_m + 1) * BLOCK_M, qk_scale,
                                      BLOCK_N, True)
    tl.store(o_ptr + base + rm[:, None] * stride_s + rd[None, :], (acc / l_i[:, None]).to(tl.float16))


# the attention reference's inner loop, called by name from _tl_attention: jitted once, at import
# (a fresh jit of _tl_attention per measurement keeps the measurement cold: Triton's cache folder
# is fresh too)
_attention_blocks = triton.jit(_tl_attention_blocks)


class Stages:
    """Triton's per-stage times of the compiles in this process (its compilation listener)."""

    def __init__(self):
        self.seen: list[dict] = []

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit):
        self.seen.append({"name": metadata.get("name"), "cache_hit": cache_hit,
                          "ir_init_ms": times.ir_initialization / 1e3,
                          **{f"stage_{k}_ms": v / 1e3 for k, v in times.lowering_stages},
                          "store_ms": times.store_results / 1e3})

    def take(self) -> list[dict]:
        seen, self.seen = self.seen, []
        return seen


def fresh_caches(tmp: Path, tag: str) -> None:
    """Point tilews's and Triton's caches of this process (and its children) at empty folders."""
    for var, sub in (("TILEWS_CACHE_DIR", "tilews"), ("TRITON_CACHE_DIR", "triton")):
        path = Path(tempfile.mkdtemp(prefix=f"{tag}-{sub}-", dir=tmp))
        os.environ[var] = str(path)
    knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]


def triton_gemm_cpu(stages: Stages) -> dict:
    fn = triton.jit(_tl_matmul)
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32",
                 "K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32",
                 "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    constexprs = {(9,): BM, (10,): BN, (11,): BK}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(9)}
    t0 = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": WARPS, "num_stages": STAGES})
    total = time.perf_counter() - t0
    return {"total_s": total, "triton": stages.take()}


def triton_attention_cpu(stages: Stages) -> dict:
    fn = triton.jit(_tl_attention)
    signature = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16",
                 "sm_scale": "fp32", "stride_h": "i32", "stride_s": "i32", "BLOCK_M": "constexpr",
                 "BLOCK_N": "constexpr", "HEAD_DIM": "constexpr"}
    constexprs = {(7,): 128, (8,): 128, (9,): DIM}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5, 6)}
    t0 = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 8, "num_stages": 3})
    total = time.perf_counter() - t0
    return {"total_s": total, "triton": stages.take()}


def programs():
    return {"gemm": lambda: matmul.fn(M, N, K, block_M=BM, block_N=BN, block_K=BK,
                                      num_stages=STAGES, threads=256),
            "attention": lambda: mha_fwd_program(BATCH, HEADS, SEQ, DIM, True, **blocks(DIM, True))}


def tilews_cpu(make, stages: Stages) -> dict:
    """One cold compile for "hopper" through the backend's own pieces, each timed."""
    settings = Settings.from_env()
    backend = backends.chain("hopper", Services(DiskCache.from_settings(settings), settings,
                                                targets.machine()), pass_config.resolve({}))[0]
    t0 = time.perf_counter()
    kernel = build_kernel(make())
    t1 = time.perf_counter()
    passes, last = [], [t1]

    def observe(name, _kernel):
        now = time.perf_counter()
        passes.append((name, now - last[0]))
        last[0] = now
    lowered = lower(kernel, backend.config, observe)
    t2 = time.perf_counter()
    source = backend.emit(lowered)
    t3 = time.perf_counter()
    program = backend.load(lowered, source, {})
    t4 = time.perf_counter()
    assert "ptx" in program.asm
    seen = [s for s in stages.take() if not s["cache_hit"]]
    return {"total_s": t4 - t0, "frontend_s": t1 - t0, "passes_s": t2 - t1, "emit_s": t3 - t2,
            "load_s": t4 - t3, "in_process": bool(seen), "triton": seen,
            "per_pass_s": dict(passes[1:])}


def child_startup() -> float:
    """Seconds a fresh Python takes to import what the compile child imports."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD_IMPORTS], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)})
    return time.perf_counter() - t0


def triton_gemm_gpu(stages: Stages) -> dict:
    fn = triton.jit(_tl_matmul)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn[(N // BN, M // BM)](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), BM, BN, BK,
                           num_warps=WARPS, num_stages=STAGES)
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return {"total_s": total, "triton": stages.take()}


def triton_attention_gpu(stages: Stages) -> dict:
    fn = triton.jit(_tl_attention)
    q, k, v = (torch.randn(BATCH, HEADS, SEQ, DIM, device="cuda", dtype=torch.float16)
               for _ in range(3))
    o = torch.empty_like(q)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn[(SEQ // 128, BATCH * HEADS)](q, k, v, o, DIM ** -0.5, q.stride(1), q.stride(2), 128, 128,
                                    DIM, num_warps=8, num_stages=3)
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return {"total_s": total, "triton": stages.take()}


def tilews_gpu(make, stages: Stages) -> dict:
    """A cold ``tilews.compile`` for "hopper" and its first launch (synchronized)."""
    t0 = time.perf_counter()
    kernel = tilews.compile(make(), target="hopper")
    t1 = time.perf_counter()
    args = [torch.randn(*p.static_shape, device="cuda", dtype=p.dtype.torch_dtype)
            for p in kernel.ir_before.params]
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    kernel(*args)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    assert kernel.report.backend == "gluon", kernel.report
    compiles = [s for s in stages.take() if not s["cache_hit"]]
    return {"total_s": (t1 - t0) + (t3 - t2), "compile_s": t1 - t0, "first_launch_s": t3 - t2,
            "triton_compiles": len(compiles), "triton": compiles}


def summarize(rounds: list[dict]) -> dict:
    out = {}
    for name in ("triton_attention", "gemm", "attention"):
        ratios = [r[name]["total_s"] / r["triton_gemm"]["total_s"] for r in rounds]
        out[name] = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios),
                     "total_s_median": statistics.median(r[name]["total_s"] for r in rounds)}
    floor = [r["attention"]["total_s"] / r["triton_attention"]["total_s"] for r in rounds]
    out["attention"]["to_triton_attention_median"] = statistics.median(floor)
    out["triton_gemm"] = {"total_s_median": statistics.median(r["triton_gemm"]["total_s"]
                                                              for r in rounds)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="cold compile + first launch on an sm_90 GPU")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    args = ap.parse_args(argv)
    if args.gpu and not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        ap.error("--gpu needs an sm_90 GPU")
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("unset TRITON_INTERPRET: the reference compiles for sm_90a")
    stages = Stages()
    knobs.compilation.listener = stages
    program = tilews_gpu if args.gpu else tilews_cpu
    measure = {"triton_gemm": triton_gemm_gpu if args.gpu else triton_gemm_cpu,
               "triton_attention": triton_attention_gpu if args.gpu else triton_attention_cpu,
               **{name: functools.partial(program, make) for name, make in programs().items()}}
    names = list(measure)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="tilews-profile-") as tmp:
        fresh_caches(Path(tmp), "warm")
        for name in names:                       # imports and first-use costs (a JIT function's
            measure[name](stages)                # hash, ...) on both sides, outside the measurements
        for r in range(args.rounds):
            row = {}
            for name in names[r % len(names):] + names[:r % len(names)]:
                fresh_caches(Path(tmp), f"r{r}-{name}")
                row[name] = measure[name](stages)
            if not args.gpu:
                row["child_startup_s"] = child_startup()
            rounds.append(row)
            print(f"round {r}: " + ", ".join(f"{n} {row[n]['total_s']:.2f}s" for n in names), flush=True)
    summary = summarize(rounds)
    where = torch.cuda.get_device_name() if args.gpu else "CPU (compile-only: no GPU launch)"
    print(f"\ncold compile{' + first launch' if args.gpu else ''} on {where}, {args.rounds} rounds; "
          f"Triton tl.dot GEMM median {summary['triton_gemm']['total_s_median']:.2f}s")
    for name in ("triton_attention", "gemm", "attention"):
        s = summary[name]
        print(f"  {name:16s} median {s['total_s_median']:.2f}s = {s['ratio_median']:.2f}x Triton GEMM "
              f"(rounds {s['ratio_min']:.2f}..{s['ratio_max']:.2f}x)"
              + (f", {s['to_triton_attention_median']:.2f}x Triton attention"
                 if name == "attention" else ""))
        _breakdown(name, rounds, args.gpu)
    if args.json:
        args.json.write_text(json.dumps({"mode": "gpu" if args.gpu else "cpu", "device": where,
                                         "summary": summary, "rounds": rounds}, indent=1))
    return 0


def _median(rounds, name, key):
    return statistics.median(r[name].get(key, 0.0) for r in rounds)


def _breakdown(name: str, rounds: list[dict], gpu: bool) -> None:
    if name.startswith("triton_"):
        if not gpu:
            _triton_stages("stages", rounds, name)
        return
    if gpu:
        print(f"    compile {_median(rounds, name, 'compile_s'):.2f}s, first launch "
              f"{_median(rounds, name, 'first_launch_s'):.2f}s, Triton compiles per program: "
              f"{sorted({r[name]['triton_compiles'] for r in rounds})}")
        return
    parts = {k: _median(rounds, name, k) for k in ("frontend_s", "passes_s", "emit_s", "load_s")}
    print("    " + ", ".join(f"{k[:-2]} {v * 1e3:.0f}ms" for k, v in parts.items()))
    slow = sorted(rounds[0][name]["per_pass_s"], key=lambda p: -_pass(rounds, name, p))[:5]
    print("    slowest passes: " + ", ".join(f"{p} {_pass(rounds, name, p) * 1e3:.0f}ms" for p in slow))
    if all(r[name]["in_process"] for r in rounds):
        _triton_stages("load = triton.compile in this process", rounds, name)
    else:
        start = statistics.median(r["child_startup_s"] for r in rounds)
        print(f"    load = compile child: start-up + imports ~{start:.2f}s, triton.compile "
              f"~{parts['load_s'] - start:.2f}s (a child that only imports, measured apart)")


def _triton_stages(what: str, rounds: list[dict], name: str) -> None:
    keys = [k for k in rounds[0][name]["triton"][0] if k.endswith("_ms")]
    print(f"    {what}: " + ", ".join(
        f"{k[:-3]} {statistics.median(r[name]['triton'][0][k] for r in rounds):.0f}ms" for k in keys))


def _pass(rounds, name, p):
    return statistics.median(r[name]["per_pass_s"].get(p, 0.0) for r in rounds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
