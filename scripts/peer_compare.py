"""TileLang's own example kernels, built by TileLang 0.1.15 and by tilews from the same source,
checked against each other and against torch, and timed in interleaved rounds on one GPU.

    python scripts/tilelang_suite.py fetch          # the example files -> .tilelang_suite/
    bash ../shared/tools/pack_tilelang.sh           # TileLang 0.1.15 -> .peers/ (GPU machine)
    python scripts/peer_compare.py [--cases mla_decode,gqa_decode_varlen,...] [--rounds 7]

Each case loads one example module twice: ``.tilelang_suite/original/<dir>/<file>`` (imports
tilelang) and ``.tilelang_suite/tilews/<dir>/<file>`` (the same text, import lines changed), calls
the example's own kernel factory with the same explicit configs (an ``@autotune`` factory then
compiles without tuning, in both libraries, as the examples' own ``main`` relies on), runs both
kernels on the same random inputs, and compares each output with a float32 torch reference.
Timing: ``rounds`` rounds, each timing tilews then TileLang (CUDA events over enough
launches for ~25 ms), so both see the same machine state; the table gives each one's median time
and the median tilews/TileLang ratio with its spread (min-max over rounds; < 1 means tilews is
faster); a case with a torch baseline (GEMV: ``torch.mv``; the warp-specialized GEMMs:
``torch.matmul``; cuBLAS) times it in the same rounds and gives the tilews/torch ratio too; a
case whose computation a ``tilews.ops`` op also does (``OPS``: the GQA and MLA decode examples)
times the op in the same rounds and gives ops/TileLang. The
TileLang import needs ``.peers`` unpacked on ``PYTHONPATH`` (peers-on-gpu.md); this script unpacks
it into /tmp/site when it finds ``.peers/tilelang.tar.xz``. JSON goes to ``$OUT/peer_compare.json``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUITE = ROOT / ".tilelang_suite"
STAND_IN = ROOT / "scripts/suite_stubs/flash_attn/__init__.py"   # the varlen cases' reference
DEVICE = "cuda"         # where the cases' inputs live (tests/test_peer_cases.py: the CPU)


def unpack_peers() -> None:
    pack = ROOT / ".peers" / "tilelang.tar.xz"
    site = pathlib.Path("/tmp/site")
    if pack.exists() and not (site / "tilelang").exists():
        site.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", str(pack), "-C", str(site)], check=True)
    if site.exists() and str(site) not in sys.path:
        sys.path.append(str(site))


def load(flavour: str, folder: str, file: str):
    """The example module ``folder/file`` as ``flavour`` ('original' or 'tilews') has it; sibling
    modules it imports are dropped from ``sys.modules`` first, so each flavour gets its own."""
    where = SUITE / flavour / folder
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if f.startswith(str(SUITE)):
            del sys.modules[name]
    sys.path.insert(0, str(where))
    try:
        spec = importlib.util.spec_from_file_location(f"{flavour}_{file[:-3]}", where / file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(where))


# ----------------------------------------------------------------------------------------------
# cases: (folder, file, build(module) -> kernel, inputs() -> args, reference(args) -> outputs, flops)


def _mla_decode(batch=132, heads=128, kv_ctx=8192, dim=512, pe_dim=64):
    import torch

    def build(mod):
        return mod.flashattn(batch, heads, 1, kv_ctx, dim, pe_dim, 64, 64, 1, (dim + pe_dim) ** -0.5)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        r = lambda *s: torch.randn(*s, device=DEVICE, dtype=torch.float16, generator=g)
        return [r(batch, heads, dim), r(batch, heads, pe_dim), r(batch, kv_ctx, 1, dim),
                r(batch, kv_ctx, 1, pe_dim)]

    def reference(q, q_pe, kv, k_pe):
        qf = torch.cat([q, q_pe], -1).float()                      # [b, h, d + pe]
        kf = torch.cat([kv, k_pe], -1).float()[:, :, 0]            # [b, s, d + pe]
        p = torch.softmax(qf @ kf.transpose(1, 2) * (dim + pe_dim) ** -0.5, -1)
        return [p @ kv.float()[:, :, 0]]

    flops = 2 * batch * heads * kv_ctx * (2 * dim + pe_dim)
    return "deepseek_mla", "example_mla_decode.py", build, inputs, reference, flops


def _gqa_decode_varlen(batch=64, q_heads=32, kv_heads=8, max_k=8192, head=128, sink=True):
    import torch

    lens = torch.randint(max_k // 4, max_k + 1, (batch,), generator=torch.Generator().manual_seed(1))
    cu = torch.zeros(batch + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    total = int(cu[-1])

    def build(mod):
        return mod.flashattn(batch, q_heads, kv_heads, max_k, total, head, sink)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        r = lambda *s, dt=torch.float16: torch.randn(*s, device=DEVICE, dtype=dt, generator=g)
        return [r(batch, q_heads, head), r(total, kv_heads, head), r(total, kv_heads, head),
                cu.to(DEVICE), r(q_heads, dt=torch.float32) * 0.1]

    def reference(q, k, v, cu_k, s_aux):
        outs = []
        rep = q_heads // kv_heads
        for b in range(batch):
            kb = k[cu_k[b]:cu_k[b + 1]].float().repeat_interleave(rep, 1)   # [s, h, d]
            vb = v[cu_k[b]:cu_k[b + 1]].float().repeat_interleave(rep, 1)
            logits = torch.einsum("hd,shd->hs", q[b].float(), kb) / math.sqrt(head)
            m = torch.maximum(logits.max(-1, keepdim=True).values, s_aux[:, None])
            e = torch.exp(logits - m)
            w = e / (e.sum(-1, keepdim=True) + torch.exp(s_aux[:, None] - m))
            outs.append(torch.einsum("hs,shd->hd", w, vb))
        return [torch.stack(outs)]

    flops = 4 * q_heads * total * head
    return "flash_decoding", "example_gqa_decode_varlen_logits.py", build, inputs, reference, flops


def _attention(dim, causal, batch=8, heads=16, seq=4096, block_M=128, block_N=128, stages=2,
               threads=256):
    import torch

    def build(mod):
        return mod.flashattn(batch, heads, seq, dim, causal, block_M=block_M,
                                     block_N=block_N, num_stages=stages, threads=threads)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        return [torch.randn(batch, seq, heads, dim, device=DEVICE, dtype=torch.float16, generator=g)
                for _ in range(3)]

    def reference(q, k, v):
        return [torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=causal).transpose(1, 2).float()]

    flops = 4 * batch * heads * seq * seq * dim // (2 if causal else 1)
    return "flash_attention", "example_mha_fwd_bshd.py", build, inputs, reference, flops


def _randn(g, *shape, dtype=None):
    import torch
    return torch.randn(*shape, device=DEVICE, dtype=dtype or torch.float16, generator=g)


def _attention_grads(q, k, v, do, causal, layout):
    """The float32 forward output, log2-based log-sum-exp and ``Delta`` (rowsum(O * dO)) and the
    gradients dQ, dK, dV of softmax attention (scale 1/sqrt(D_qk)), a batch element at a time;
    ``layout`` 'bhsd' or 'bshd'; K and V may have fewer heads than Q (GQA: dK and dV summed over
    each group of query heads)."""
    import torch
    heads_dim = 1 if layout == "bhsd" else 2
    groups = q.shape[heads_dim] // k.shape[heads_dim]
    scale = q.shape[-1] ** -0.5
    per_batch = []
    for b in range(q.shape[0]):
        # [h, s, d], K and V repeated per query head
        qb, kb, vb, dob = (x[b].float() if layout == "bhsd" else x[b].float().transpose(0, 1)
                           for x in (q, k, v, do))
        kb, vb = kb.repeat_interleave(groups, 0), vb.repeat_interleave(groups, 0)
        s = qb @ kb.transpose(1, 2) * scale
        if causal:
            s = s.masked_fill(torch.ones_like(s[0], dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(s, -1)
        o = p @ vb
        delta = (o * dob).sum(-1)
        ds = p * (dob @ vb.transpose(1, 2) - delta[..., None])
        grads = [ds @ kb * scale, ds.transpose(1, 2) @ qb * scale, p.transpose(1, 2) @ dob]
        grads[1:] = [g.unflatten(0, (-1, groups)).sum(1) for g in grads[1:]]
        per_batch.append([o, torch.logsumexp(s, -1) * math.log2(math.e), delta, *grads])
    outs = [torch.stack(xs) for xs in zip(*per_batch)]
    if layout == "bshd":
        outs = [x if x.dim() == 3 else x.transpose(1, 2).contiguous() for x in outs]
    return dict(zip(("o", "lse", "delta", "dq", "dk", "dv"), outs))


def _attention_bwd(file, part, causal, batch, heads, seq, dim_qk, dim_v, groups=1):
    """TileLang's attention backward example ``file``: ``part`` 'kernel' times its main kernel
    alone (dQ, dK, dV cleared first, as its accumulations need; checks dK and dV, since dQ leaves it
    in the example's atomic-add layout), 'backward' the whole backward its autograd function runs
    (preprocess for Delta, the main kernel, postprocess for dQ; checks dQ, dK, dV). The inputs Q, K,
    V, dO are random; O, LSE and Delta come from the float32 reference, with the example's block
    sizes. ``example_mha_bwd_bhsd.py`` is [B, H, S, D] MHA; ``example_gqa_bwd.py`` [B, S, H, D]
    with ``heads // groups`` K/V heads and its atomic-add kernel (dK, dV in float32)."""
    import torch
    mha = file == "example_mha_bwd_bhsd.py"
    kv_heads = heads // groups
    layout = "bhsd" if mha else "bshd"
    shape = (lambda h, d: (batch, h, seq, d)) if mha else (lambda h, d: (batch, seq, h, d))

    def build(mod):
        if mha:
            block_n = 64 if dim_qk <= 64 else 32
            kernel = mod.flashattn_bwd(batch, heads, seq, dim_qk, causal, 64, block_n)
            prep = mod.flashattn_bwd_preprocess(batch, heads, seq, dim_qk)
            kv_dtype = torch.float16
        else:
            kernel = mod.flashattn_bwd_atomic_add(batch, heads, seq, dim_qk, dim_v, causal, 128, 32,
                                                  threads=256, num_stages=2, groups=groups)
            prep = mod.flashattn_bwd_preprocess(batch, heads, seq, dim_v)
            kv_dtype = torch.float32
        post = mod.flashattn_bwd_postprocess(batch, heads, seq, dim_qk)
        dq = torch.empty(shape(heads, dim_qk), device=DEVICE)
        dk = torch.full(shape(kv_heads, dim_qk), float("nan"), device=DEVICE, dtype=kv_dtype)
        dv = torch.full(shape(kv_heads, dim_v), float("nan"), device=DEVICE, dtype=kv_dtype)

        def main_kernel(q, k, v, do, lse, delta):
            dq.zero_()
            if not mha:                         # atomic adds into dK, dV
                dk.zero_()
                dv.zero_()
            kernel(q, k, v, do, lse, delta, dq, dk, dv)

        def run(q, k, v, do, o, lse, delta):
            if part == "kernel":
                main_kernel(q, k, v, do, lse, delta)
                return dk, dv
            main_kernel(q, k, v, do, lse, prep(o, do))
            return post(dq), dk.half(), dv.half()
        return run

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        q, do = _randn(g, *shape(heads, dim_qk)), _randn(g, *shape(heads, dim_v))
        k, v = _randn(g, *shape(kv_heads, dim_qk)), _randn(g, *shape(kv_heads, dim_v))
        ref = _attention_grads(q, k, v, do, causal, layout)
        return [q, k, v, do, ref["o"].half(), ref["lse"], ref["delta"]]

    def reference(q, k, v, do, o, lse, delta):
        ref = _attention_grads(q, k, v, do, causal, layout)
        return [ref["dk"], ref["dv"]] if part == "kernel" else [ref["dq"], ref["dk"], ref["dv"]]

    flops = 2 * batch * heads * seq * seq * (3 * dim_qk + 2 * dim_v) // (2 if causal else 1)
    return "flash_attention", file, build, inputs, reference, flops


def _gqa_decode(batch, heads=32, kv_heads=8, seq=8192, dim=128, block_N=128, block_H=64,
                num_split=8, stages=2, threads=128):
    """``flash_decoding/example_gqa_decode.py``: one query token per sequence, K/V masked by a
    random 0/1 mask, split over ``num_split`` blocks of keys and combined (a second kernel of the
    same program; the example's Hopper heuristic config)."""
    import torch

    def build(mod):
        return mod.flashattn(batch, heads, kv_heads, seq, dim, block_N, block_H, num_split, stages,
                             threads)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        mask = torch.randint(0, 2, (batch, seq, kv_heads), device=DEVICE, dtype=torch.uint8,
                             generator=g)
        return [_randn(g, batch, heads, dim), _randn(g, batch, seq, kv_heads, dim),
                _randn(g, batch, seq, kv_heads, dim), mask]

    def reference(q, k, v, mask):
        rep = heads // kv_heads
        kf, vf = (x.float().repeat_interleave(rep, 2) for x in (k, v))        # [b, s, h, d]
        logits = torch.einsum("bhd,bshd->bhs", q.float(), kf) / math.sqrt(dim)
        logits = logits.masked_fill(mask.repeat_interleave(rep, 2).transpose(1, 2) == 0,
                                    float("-inf"))
        return [torch.einsum("bhs,bshd->bhd", torch.softmax(logits, -1), vf)]

    return "flash_decoding", "example_gqa_decode.py", build, inputs, reference, \
        4 * batch * heads * seq * dim


def _fwd_varlen(file, causal, batch, heads, max_seq, dim, kv_heads=None, block_M=128, block_N=128,
                stages=2, threads=256):
    """TileLang's varlen forward examples: ``example_mha_fwd_varlen.py`` (MHA) and
    ``example_gqa_fwd_varlen.py`` (``kv_heads`` K/V heads), sequences of random lengths in
    [max_seq / 2, max_seq], Q's and K's drawn apart (causal then aligned to the bottom right), with
    the config the MHA example recommends for Hopper; the reference is the suite's float32
    ``flash_attn_varlen_func`` stand-in (scripts/suite_stubs)."""
    import torch
    kv_heads = kv_heads or heads
    lens = torch.randint(max_seq // 2, max_seq + 1, (2, batch),
                         generator=torch.Generator().manual_seed(1))
    cu_q, cu_k = (torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]).to(torch.int32)
                  for n in lens)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    spec = importlib.util.spec_from_file_location("flash_attn_stand_in", STAND_IN)
    stand_in = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_in)

    def build(mod):
        if file == "example_mha_fwd_varlen.py":
            return mod.flashattn(batch, total_q, total_k, heads, dim, causal, block_M=block_M,
                                 block_N=block_N, num_stages=stages, threads=threads)
        return mod.flashattn(batch, heads // kv_heads, total_q, total_k, heads, dim, causal,
                             block_M=block_M, block_N=block_N, num_stages=stages, threads=threads)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        return [_randn(g, total_q, heads, dim), _randn(g, total_k, kv_heads, dim),
                _randn(g, total_k, kv_heads, dim), cu_q.to(DEVICE), cu_k.to(DEVICE),
                int(lens[0].max())]

    def reference(q, k, v, cu_q, cu_k, max_q):
        out = stand_in.flash_attn_varlen_func(q.float(), k.float(), v.float(), cu_q, cu_k, max_q,
                                              int(lens[1].max()), causal=causal)
        return [out]

    pairs = sum(int(torch.clamp(torch.arange(lq) + lk - lq + 1, 0, lk).sum()) if causal else lq * lk
                for lq, lk in lens.T.tolist())
    return "flash_attention", file, build, inputs, reference, 4 * heads * dim * pairs


def _gemv(n, k, block_n, reduce_threads, form="splitk_gemv_vectorized_tvm"):
    """TileLang's thread-level GEMV (``gemv/example_gemv.py``), C[n] = B[n, :] . A, fp16 with
    float32 accumulation; the baseline is ``torch.mv`` (cuBLAS) on the same tensors."""
    import torch

    def build(mod):
        return getattr(mod, form).compile(N=n, K=k, BLOCK_N=block_n, reduce_threads=reduce_threads)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        return [torch.randn(k, device=DEVICE, dtype=torch.float16, generator=g),
                torch.randn(n, k, device=DEVICE, dtype=torch.float16, generator=g)]

    def reference(a, b):
        return [b.float() @ a.float()]

    def baseline(a, b):
        return lambda: torch.mv(b, a)

    return "gemv", "example_gemv.py", build, inputs, reference, 2 * n * k, baseline


def _ws_gemm(file, factory, size=8192, blocks=(128, 128, 64)):
    """TileLang's explicit warp-specialized GEMMs (``warp_specialize/``), fp16 at ``size``^3 with
    the block sizes of each example's ``main``; the baseline is ``torch.matmul`` (cuBLAS)."""
    import torch

    def build(mod):
        matmul = getattr(mod, factory)
        return lambda a, b: matmul(a, b, *blocks)

    def inputs():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        return [torch.randn(size, size, device=DEVICE, dtype=torch.float16, generator=g)
                for _ in range(2)]

    def reference(a, b):
        return [a.float() @ b.float()]

    def baseline(a, b):
        return lambda: torch.matmul(a, b)

    return "warp_specialize", file, build, inputs, reference, 2 * size ** 3, baseline


# the five warp_specialize GEMM examples: case name -> (file, the example's kernel factory)
WS_GEMMS = {
    "ws_barrierpipe_stage2": ("example_warp_specialize_gemm_barrierpipe_stage2.py", "matmul"),
    "ws_copy_0_gemm_1": ("example_warp_specialize_gemm_copy_0_gemm_1.py",
                         "matmul_warp_specialize_copy_0_gemm_1"),
    "ws_copy_1_gemm_0": ("example_warp_specialize_gemm_copy_1_gemm_0.py",
                         "matmul_warp_specialize_copy_1_gemm_0"),
    "ws_copy_gemm_0_1": ("example_warp_specialize_gemm_copy_gemm_0_1.py",
                         "matmul_warp_specialize_copy_gemm_0_1"),
    "ws_softpipe_stage2": ("example_warp_specialize_gemm_softpipe_stage2.py", "matmul"),
}


# the GEMV's (BLOCK_N, reduce_threads) configs of at least a warp (the example's autotuning space)
GEMV_CONFIGS = [(2, 32), (4, 32), (8, 32), (16, 32), (8, 8), (16, 8), (32, 8), (32, 4), (64, 4)]


def _decode_op(q, k, v, mask):
    """``tilews.ops.decode_attention`` on the GQA example's tensors, timed beside its kernels
    (the example's random key mask has no counterpart there: every key is read either way)."""
    from tilews.ops import decode_attention
    q4 = q.unsqueeze(1)
    return lambda: decode_attention(q4, k, v)


def _mla_op(q, q_pe, kv, k_pe):
    """``tilews.ops.mla_decode`` on the MLA example's tensors (the same computation)."""
    from tilews.ops import mla_decode
    return lambda: mla_decode(q, q_pe, kv, k_pe)


# cases whose computation a tilews.ops op also does: the op is timed in the same rounds and
# compared with TileLang's kernel (issue 40: decode ops not slower than TileLang's own kernels)
OPS = {"gqa_decode": _decode_op, "gqa_decode_b64": _decode_op, "mla_decode": _mla_op}

CASES = {
    **{f"gemv_{n}_{bn}x{rt}": (lambda n=n, bn=bn, rt=rt: _gemv(n, 4096, bn, rt))
       for n in (4096, 14336) for bn, rt in GEMV_CONFIGS},
    "gemv_4096_vec": lambda: _gemv(4096, 4096, 2, 32, "splitk_gemv_vectorized"),
    **{name: (lambda file=file, factory=factory: _ws_gemm(file, factory))
       for name, (file, factory) in WS_GEMMS.items()},
    "mla_decode": _mla_decode,
    "gqa_decode_varlen": _gqa_decode_varlen,
    "attention_d128": lambda: _attention(128, False),
    "attention_d128_causal": lambda: _attention(128, True),
    "attention_d96": lambda: _attention(96, False),
    "attention_d192": lambda: _attention(192, False, block_N=64),
    "attention_d192_causal": lambda: _attention(192, True, block_N=64),
    **{f"mha_bwd{'_kernel' if part == 'kernel' else ''}_d{d}{'_causal' if causal else ''}":
       (lambda part=part, d=d, causal=causal:
        _attention_bwd("example_mha_bwd_bhsd.py", part, causal, 8, 16, 4096, d, d))
       for part in ("kernel", "backward") for d in (64, 128) for causal in (False, True)},
    **{f"gqa_bwd{'_kernel' if part == 'kernel' else ''}{'_causal' if causal else ''}":
       (lambda part=part, causal=causal:
        _attention_bwd("example_gqa_bwd.py", part, causal, 8, 32, 2048, 192, 128, groups=16))
       for part in ("kernel", "backward") for causal in (False, True)},
    "gqa_decode": lambda: _gqa_decode(1),
    "gqa_decode_b64": lambda: _gqa_decode(64),
    "mha_fwd_varlen": lambda: _fwd_varlen("example_mha_fwd_varlen.py", False, 8, 64, 2048, 128),
    "mha_fwd_varlen_causal": lambda: _fwd_varlen("example_mha_fwd_varlen.py", True, 8, 64, 2048,
                                                 128),
    "gqa_fwd_varlen": lambda: _fwd_varlen("example_gqa_fwd_varlen.py", False, 8, 64, 2048, 128,
                                          kv_heads=4),
    "gqa_fwd_varlen_causal": lambda: _fwd_varlen("example_gqa_fwd_varlen.py", True, 8, 64, 2048,
                                                 128, kv_heads=4),
}


# ----------------------------------------------------------------------------------------------


def launches_ms(fn, target_ms=25.0) -> float:
    """The mean time of one launch (ms), from CUDA events around enough launches for ~target_ms."""
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    n = max(3, min(1000, int(target_ms / max(start.elapsed_time(end), 1e-3))))
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def graph_ms(fn, per_graph=50, target_ms=25.0) -> float:
    """The mean time of one launch (ms) replayed from a CUDA graph of ``per_graph`` launches: the
    GPU's time without the host's launch cost (what decode loops captured in graphs see)."""
    return launches_ms(capture_graph(fn, per_graph).replay, target_ms) / per_graph


def capture_graph(fn, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn``, warmed up on a side stream first."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def max_rel_err(outputs, want: list) -> float:
    """The largest of each output's max |error| over its reference's max |value|."""
    got = [g.float() for g in as_list(outputs)][:len(want)]
    return max(float((g - w).abs().max() / w.abs().max().clamp_min(1e-6))
               for g, w in zip(got, want))


def run_case(name: str, rounds: int, graphs: bool = False) -> dict:
    import torch
    folder, file, build, inputs, reference, flops, *baseline = CASES[name]()
    row = {"case": name, "example": f"{folder}/{file}"}
    kernels, outputs = {}, {}
    args = inputs()
    for flavour, label in (("tilews", "tilews"), ("original", "tilelang")):
        try:
            # build_s: the build and the first call, synchronized (an example whose factory
            # compiles at its first call, as the warp_specialize ones do, counts its compile)
            t0 = time.perf_counter()
            kernels[label] = build(load(flavour, folder, file))
            outputs[label] = kernels[label](*args)
            torch.cuda.synchronize()
            row[f"{label}_build_s"] = round(time.perf_counter() - t0, 1)
        except Exception as e:          # noqa: BLE001 - reported in the table
            row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
    want = [w.float() for w in reference(*args)]
    for label, out in outputs.items():
        try:
            row[f"{label}_rel_err"] = max_rel_err(out, want)
        except Exception as e:          # noqa: BLE001
            row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
    runnable = {lb: (lambda k=k: k(*args)) for lb, k in kernels.items() if f"{lb}_error" not in row}
    if baseline:
        runnable["torch"] = baseline[0](*args)
    if name in OPS:
        runnable["ops"] = OPS[name](*args)
    times = {lb: [] for lb in runnable}
    timer = graph_ms if graphs else launches_ms
    row["timing"] = "cuda graphs" if graphs else "launches"
    for _ in range(rounds if len(runnable) else 0):
        for lb, fn in list(runnable.items()):
            try:
                times[lb].append(timer(fn))
            except Exception as e:      # noqa: BLE001 - e.g. a launch that cannot be captured
                row[f"{lb}_error"] = f"timing: {type(e).__name__}: {str(e)[:300]}"
                del runnable[lb], times[lb]
        torch.cuda.synchronize()
    for lb, ts in times.items():
        row[f"{lb}_ms"] = statistics.median(ts)
        row[f"{lb}_tflops"] = flops / statistics.median(ts) * 1e-9
    for mine, peer, key in (("tilews", "tilelang", "ratio"), ("tilews", "torch", "ratio_torch"),
                            ("ops", "tilelang", "ratio_ops")):
        if mine in times and peer in times:
            ratios = [a / b for a, b in zip(times[mine], times[peer])]
            row[key] = statistics.median(ratios)
            row[key + "_spread"] = [min(ratios), max(ratios)]
    if "tilews" in kernels:
        report = getattr(kernels["tilews"], "report", None)
        row["tilews_backend"] = str(getattr(report, "backend", "") or "")[:80]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--graphs", action="store_true",
                    help="time launches replayed from CUDA graphs (the GPU's time, no host cost)")
    opts = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("peer_compare needs a CUDA GPU (it times TileLang's and tilews's kernels on it)")
    unpack_peers()
    rows = []
    for name in opts.cases.split(","):
        print(f"== {name}", flush=True)
        rows.append(run_case(name, opts.rounds, opts.graphs))
        print(json.dumps(rows[-1]), flush=True)
    out = pathlib.Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    name = "peer_compare_graphs.json" if opts.graphs else "peer_compare.json"
    (out / name).write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "rounds": opts.rounds, "rows": rows}, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, {opts.rounds} rounds, interleaved"
          f"{', CUDA graphs' if opts.graphs else ''}")
    print(f"{'case':24} {'tilews ms':>10} {'TileLang ms':>12} {'tw/TL':>7} {'spread':>13} "
          f"{'tw err':>9} {'TL err':>9} {'torch ms':>9} {'tw/torch':>8} {'spread':>11}")
    for r in rows:
        fmt = lambda k, f: (f.format(r[k]) if k in r else "-")
        spread = "-" if "ratio_spread" not in r else "{:.2f}-{:.2f}".format(*r["ratio_spread"])
        spread_torch = ("-" if "ratio_torch_spread" not in r
                        else "{:.2f}-{:.2f}".format(*r["ratio_torch_spread"]))
        print(f"{r['case']:24} {fmt('tilews_ms', '{:.4f}'):>10} {fmt('tilelang_ms', '{:.4f}'):>12} "
              f"{fmt('ratio', '{:.3f}'):>7} {spread:>13} {fmt('tilews_rel_err', '{:.1e}'):>9} "
              f"{fmt('tilelang_rel_err', '{:.1e}'):>9} {fmt('torch_ms', '{:.4f}'):>9} "
              f"{fmt('ratio_torch', '{:.3f}'):>8} {spread_torch:>11}")
        for lb in ("tilews", "tilelang"):
            if f"{lb}_error" in r:
                print(f"    {lb}: {r[lb + '_error'][:300]}")
    for r in rows:
        if "ratio_ops" in r:
            print(f"tilews.ops on {r['case']}: {r['ops_ms']:.4f} ms, TileLang's kernel "
                  f"{r['tilelang_ms']:.4f} ms: ops/TileLang {r['ratio_ops']:.3f} "
                  "({:.2f}-{:.2f})".format(*r["ratio_ops_spread"]))
    best_of_configs(rows)


def best_of_configs(rows: list) -> None:
    """Cases that differ only in a config (``gemv_<n>_<BLOCK_N>x<threads>``): each library at its
    fastest config, and torch, from the medians above."""
    groups: dict[str, list] = {}
    for r in rows:
        stem, _, config = r["case"].rpartition("_")
        if "x" in config and stem.startswith("gemv_"):
            groups.setdefault(stem, []).append((config, r))
    for stem, members in groups.items():
        best = {}
        for lb in ("tilews", "tilelang", "torch"):
            timed = [(r[f"{lb}_ms"], config) for config, r in members if f"{lb}_ms" in r]
            if timed:
                best[lb] = min(timed)
        line = ", ".join(f"{lb} {ms * 1e3:.2f} us ({config})" for lb, (ms, config) in best.items())
        ratios = ""
        if "tilews" in best and "tilelang" in best:
            ratios += f"; tilews/TileLang {best['tilews'][0] / best['tilelang'][0]:.3f}"
        if "tilews" in best and "torch" in best:
            ratios += f"; tilews/torch {best['tilews'][0] / best['torch'][0]:.3f}"
        print(f"best of configs, {stem}: {line}{ratios}")


if __name__ == "__main__":
    main()
