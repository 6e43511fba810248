"""Per-call host time of a cached tiny tilews kernel, broken into its parts, against a raw
@triton.jit launch and torch.matmul (exploration for issue 13's launch fast path)."""
import statistics
import time

import torch
import triton
import triton.language as tl

import tilews
import tilews.language as T
from tilews.ops import gemm_programs as g


@triton.jit
def tiny(A, B, C, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(A + i[:, None] * N + i[None, :])
    b = tl.load(B + i[:, None] * N + i[None, :])
    tl.store(C + i[:, None] * N + i[None, :], tl.dot(a, b).to(tl.bfloat16))


def per_call_us(fn, n=2000, rounds=5):
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out), min(out), max(out)


def main():
    a = torch.randn(64, 64, device="cuda").bfloat16()
    b = torch.randn(64, 64, device="cuda").bfloat16()
    c = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    k_gl = tilews.jit(out_idx=[-1], target="hopper")(g.tiled.fn)(64, 64, 64, block_M=64, block_N=64, block_K=64, num_stages=2)
    k_dyn = tilews.jit(out_idx=[-1], target="hopper")(g.tiled.fn)(T.dynamic("M"), 64, 64, block_M=64, block_N=64, block_K=64, num_stages=2)
    k_tl = tilews.jit(out_idx=[-1], target="triton")(g.tiled.fn)(64, 64, 64, block_M=64, block_N=64, block_K=64, num_stages=2)
    ref = a.float() @ b.float()
    for k in (k_gl, k_dyn, k_tl):
        assert ((k(a, b).float() - ref).norm() / ref.norm()).item() < 1e-2, k
    tiny[(1,)](a, b, c, 64)
    assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2
    rows = {}
    for _ in range(2):
        rows["raw @triton.jit tiny[(1,)](a, b, c, 64)"] = per_call_us(lambda: tiny[(1,)](a, b, c, 64))
        rows["torch.matmul(a, b)"] = per_call_us(lambda: torch.matmul(a, b))
        rows["tilews gluon kernel(a, b)"] = per_call_us(lambda: k_gl(a, b))
        rows["tilews gluon runtime-M kernel(a, b)"] = per_call_us(lambda: k_dyn(a, b))
        rows["tilews tl kernel(a, b)"] = per_call_us(lambda: k_tl(a, b))
        rows["tilews.ops.matmul(a, b)"] = per_call_us(lambda: tilews.ops.matmul(a, b))
        rows["  part: binder.bind"] = per_call_us(lambda: k_gl.binder.bind((a, b)))
        vals, _ = k_gl.binder.bind((a, b))
        rows["  part: program.launch (preallocated out)"] = per_call_us(lambda: k_gl.program.launch(vals))
        args_fn, grid_fn, launcher = k_gl.program._host
        rows["  part: args_fn (cached descriptors)"] = per_call_us(lambda: args_fn(*vals))
        flat = args_fn(*vals)
        rows["  part: launcher.specialization"] = per_call_us(lambda: launcher.specialization(flat))
        rows["  part: launcher.launch"] = per_call_us(lambda: launcher.launch(grid_fn(), flat))
        rows["  part: torch.empty(64, 64)"] = per_call_us(lambda: torch.empty(64, 64, device="cuda", dtype=torch.bfloat16))
    print(f"{torch.cuda.get_device_name()}: host microseconds per call (median of 5 rounds of 2000 calls; min-max)")
    for name, (med, lo, hi) in rows.items():
        print(f"| {name} | {med:.2f} | {lo:.2f}-{hi:.2f} |")


if __name__ == "__main__":
    main()
