"""GEMV (``splitk_gemv_vectorized_tvm``) built by tilews, launched straight through its Triton
function with compile options varied (``maxnreg``, kernel ``num_stages``), CUDA-graph timed beside
TileLang's kernel; prints each variant's registers and spills.

    python scripts/probe_gemv_regs.py [--n 14336] [--config 4x32]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from peer_compare import graph_ms, load, unpack_peers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--config", default="4x32")
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    import torch
    unpack_peers()
    bn, rt = map(int, opts.config.split("x"))
    cfg = dict(N=opts.n, K=4096, BLOCK_N=bn, reduce_threads=rt)
    a = torch.randn(4096, device="cuda", dtype=torch.float16)
    b = torch.randn(opts.n, 4096, device="cuda", dtype=torch.float16)
    tl_kernel = load("original", "gemv", "example_gemv.py").splitk_gemv_vectorized_tvm.compile(**cfg)
    tw_kernel = load("tilews", "gemv", "example_gemv.py").splitk_gemv_vectorized_tvm.compile(**cfg)
    tw_kernel(a, b)
    prog = tw_kernel.kernels[0].program
    values, _ = tw_kernel.binder.bind((a, b))
    flat = []
    for v in values:
        flat += [v, *v.stride()] if isinstance(v, torch.Tensor) else [v]
    grid = prog.grid_fn()
    runs = {"tilelang": lambda: tl_kernel(a, b), "tilews": lambda: tw_kernel(a, b)}
    for name, opts_ in {"jit": {}}.items():
        try:
            compiled = prog.fn[grid](*flat, num_warps=prog.num_warps, **opts_)
            print(f"{name}: regs {compiled.n_regs}, spills {compiled.n_spills}", flush=True)
            runs[name] = (lambda o=opts_: prog.fn[grid](*flat, num_warps=prog.num_warps, **o))
        except Exception as e:          # noqa: BLE001
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
    import importlib.util
    import tempfile
    import triton
    for name, hint in {"B_cg": "cache_modifier='.cg', ", "B_evict_first": "eviction_policy='evict_first', ",
                       "B_cv": "cache_modifier='.cv', "}.items():
        src = prog.source.replace("tl.load(B + ", f"tl.load({hint}pointer=B + ")
        path = os.path.join(tempfile.mkdtemp(), f"variant_{name}.py")
        with open(path, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = triton.jit(getattr(mod, prog.kernel.name))
        try:
            compiled = fn[grid](*flat, num_warps=prog.num_warps)
            ptx = compiled.asm["ptx"]
            print(f"{name}: regs {compiled.n_regs}; loads " + " | ".join(
                sorted({ln.split()[0] if not ln.startswith("@") else ln.split()[1]
                        for ln in map(str.strip, ptx.splitlines()) if "ld.global" in ln})), flush=True)
            runs[name] = (lambda fn=fn: fn[grid](*flat, num_warps=prog.num_warps))
        except Exception as e:          # noqa: BLE001
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}")
    times = {k: [] for k in runs}
    for _ in range(opts.rounds):
        for k, fn in runs.items():
            times[k].append(graph_ms(fn))
    print(f"N={opts.n} {opts.config}, CUDA graphs, median us: " + ", ".join(
        f"{k} {statistics.median(v) * 1e3:.2f}" for k, v in times.items()))


if __name__ == "__main__":
    main()
