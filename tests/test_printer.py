"""The printer is total over the IR's node classes and deterministic."""
from __future__ import annotations

import tilews.language as T
from tilews.lowering import ir, printer, roles
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.metal.backend import METAL
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import exprs_of, subexprs, walk


def everything():
    @T.prim_func
    def main(A: T.Tensor((T.dynamic("m"), 64), T.float16), B: T.Tensor((64, 64), T.float16),
             C: T.Tensor((64, 64), T.float32), P: T.Tensor((1,), T.ptr)):
        with T.Kernel(T.ceildiv(m, 64), threads=256) as bx:
            T.use_swizzle(4)
            A_s = T.alloc_shared((64, 64), T.float16)
            B_s = T.alloc_shared((64, 64), T.float16)
            acc = T.alloc_fragment((64, 64), T.float32)
            mx = T.alloc_fragment((64,), T.float32)
            cnt = T.alloc_local((1,), T.int32)
            bar = T.alloc_barrier([128, 128])
            with T.ws(0):
                for k in T.serial(2):
                    T.copy(A[bx * 64, 0], A_s, barrier=bar[0])
                    T.copy(B[0:64, 0:64], B_s)
                    T.barrier_arrive(bar[0])
            with T.ws(1):
                T.barrier_wait(bar[0], 0)
                T.gemm(A_s, B_s, acc, transpose_B=True, clear_accum=True)
                T.fill(mx, -1.5)
                T.reduce_max(acc, mx, dim=1, clear=False)
                T.cumsum(mx, reverse=True)
                cnt[0] = 0
                if bx > 0:
                    cnt[0] = cnt[0] + 1
                for i, j in T.Parallel(64, 64):
                    acc[i, j] = T.if_then_else(-acc[i, j] < 0 and not (i == j), T.exp(acc[i, j] - mx[i]),
                                               T.cast(T.reinterpret(cnt[0], T.uint32), T.float32))
                T.atomic_add(C[0:64, 0:64], acc)
                V = T.make_tensor(P[0], (64,), T.float32)
                T.copy(mx, V[0:64])
    return main


def hopper_gemm():
    """A GEMM after the Hopper pipeline: holds the nodes only passes create."""
    from examples.gemm import matmul
    return lower(build_kernel(matmul.fn(128, 128, 128, block_M=64, block_N=64, block_K=32)), HOPPER)


def metal_gemm():
    """A GEMM after the Metal pipeline: holds its block barriers."""
    from examples.gemm import matmul
    return lower(build_kernel(matmul.fn(64, 64, 64, block_M=32, block_N=32, block_K=16)), METAL)


def test_printer_is_total_and_deterministic():
    k = roles.split(build_kernel(everything()))
    seen = {type(k)}
    for s in list(walk(k.body)) + list(walk(hopper_gemm().body)) + list(walk(metal_gemm().body)):
        seen.add(type(s))
        for e in exprs_of(s):
            seen.update(type(x) for x in subexprs(e))
        for f in ("src", "dst", "a", "b", "c"):
            if isinstance(getattr(s, f, None), ir.Region):
                seen.add(ir.Region)
        if getattr(s, "barrier", None) is not None:
            seen.add(ir.BarrierRef)
        if isinstance(s, ir.Alloc):
            seen.add(ir.Buffer)
    seen.add(ir.Seq)
    missing = {c.__name__ for c in ir.NODE_CLASSES} - {c.__name__ for c in seen}
    assert not missing, f"the test program does not exercise {missing}"
    text = printer.to_text(k)
    assert text == printer.to_text(roles.split(build_kernel(everything())))
    hopper_text = printer.to_text(hopper_gemm())
    assert "gemm_wait outstanding=0" in hopper_text and "proxy_fence" in hopper_text
    assert "block_sync" in printer.to_text(metal_gemm())
    for needle in ("warp_specialize:", "ws(0):", "ws(1):", "on bar[0]", "transpose_b, clear_accum",
                   "fill mx[0:+64] = -1.5:f32", "reduce_max acc -> mx dim=1 accumulate", "atomic_add C[", "select(", "cast<f32>(bitcast<u32>(cnt[0]))",
                   "cumsum mx -> mx dim=0 reverse",
                   "exp(", "(not (i == j))", "view V: global f32[64] at P[0] strides=(1)", "swizzle=4", "m: param i32"):
        assert needle in text, needle
