"""The Hopper (Gluon, warp-specialized) backend on an H100/H200: numerics against float64 torch
(no NaN, rel err < 1e-2), bit-identical across two runs, the fallback for TMA-ineligible shapes,
a block-sparse GEMM (guarded pipelined loop, docs/ws-semantics.md #8), and timings against torch.matmul
in the same run (printed as a table; run with -s)."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from examples.gemm import matmul, persistent_matmul
from examples.ws_gemm import pingpong_matmul_program, ws_matmul_program, ws_ring_matmul_program
from tilews.testing import rel_err, time_ms

pytestmark = pytest.mark.gpu
ROWS = []
BIG = dict(block_M=128, block_N=256, block_K=64)


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")


def auto_ws(M, N, K, swizzle=0):
    return tilews.jit(out_idx=[-1], target="hopper")(matmul.fn)(
        M, N, K, num_stages=3, threads=256, swizzle=swizzle, dtype=T.bfloat16, **BIG)


def explicit_ring(M, N, K):
    return tilews.jit(out_idx=[-1], target="hopper")(ws_ring_matmul_program)(M, N, K, stages=3, **BIG)


def explicit_single(M, N, K):
    return tilews.jit(out_idx=[-1], target="hopper")(ws_matmul_program)(
        M, N, K, block_M=128, block_N=128, block_K=64, dtype=T.bfloat16)


def persistent(M, N, K):
    return tilews.jit(out_idx=[-1], target="hopper")(persistent_matmul.fn)(
        M, N, K, num_stages=3, threads=256, dtype=T.bfloat16, **BIG)


def pingpong(M, N, K):
    return tilews.jit(out_idx=[-1], target="hopper")(pingpong_matmul_program)(M, N, K)


# "auto": the plain T.Pipelined GEMM, which the compiler makes persistent when the tiles
# outnumber the SMs (and warp-specializes); "persistent": written with T.Persistent
VARIANTS = {"persistent ping-pong 128x128x64 s4": pingpong, "persistent (T.Persistent)": persistent,
            "auto": auto_ws, "auto swizzle 16": lambda M, N, K: auto_ws(M, N, K, 16),
            "explicit-ring ws(0)+ws(1,2)": explicit_ring}
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (1000, 1096, 1232), (8192, 8192, 1024)]


def check(kernel, M, N, K):
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    c1 = kernel(a, b)
    c2 = kernel(a, b)
    torch.cuda.synchronize()
    err = rel_err(c1, a.double() @ b.double())
    assert err < 1e-2, err
    assert torch.equal(c1, c2), "two runs differ"
    return a, b, err


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ws_gemm(variant, shape):
    _hopper()
    M, N, K = shape
    k = VARIANTS[variant](M, N, K)
    assert k.target == "hopper", (k.target, k.report.notes)
    assert "warp_specialize" in k.get_kernel_source()
    a, b, err = check(k, M, N, K)
    if M * N * K >= 4096 ** 3 // 8:
        first = time_ms(lambda: k(a, b), a.device)
        ref = time_ms(lambda: a @ b, a.device)
        second = time_ms(lambda: k(a, b), a.device)
        ours = min(first, second)
        tf = lambda ms: 2 * M * N * K / ms / 1e9  # noqa: E731
        ROWS.append((variant, f"{M}x{N}x{K}", ours, abs(first - second) / ours, ref, tf(ours), tf(ref), ref / ours, err))


def test_design_explicit_program_single_buffered():
    _hopper()
    k = explicit_single(4096, 4096, 4096)
    assert k.target == "hopper"
    check(k, 4096, 4096, 4096)


def test_unaligned_shapes_fall_back_correctly():
    _hopper()
    k = auto_ws(4095, 4097, 4099)
    assert k.target == "hopper -> triton"
    assert any("not a multiple of 16" in n for n in k.report.notes)
    check(k, 4095, 4097, 4099)


@pytest.mark.parametrize("shape", [(4095, 4097, 4099), (1000, 1100, 1234), (777, 512, 4100)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", ["auto", "persistent (T.Persistent)"])
def test_unaligned_rows_through_the_producers_registers(variant, shape):
    """tl.enable_lower_ldgstg: tiles whose rows TMA cannot take are loaded by the producer warp
    group through registers (fenced before its arrival), C stored from registers where its rows
    are unaligned too; still warp-specialized."""
    _hopper()
    program = {"auto": matmul.fn, "persistent (T.Persistent)": persistent_matmul.fn}[variant]
    kernel = tilews.jit(out_idx=[-1], target="hopper", pass_configs={"tl.enable_lower_ldgstg": True})(
        program)(*shape, num_stages=3, threads=256, dtype=T.bfloat16, **BIG)
    assert kernel.report.target == "hopper", kernel.report.notes
    a, b, err = check(kernel, *shape)
    first = time_ms(lambda: kernel(a, b), a.device)
    ref = time_ms(lambda: a @ b, a.device)
    second = time_ms(lambda: kernel(a, b), a.device)
    ours, (M, N, K) = min(first, second), shape
    tf = lambda ms: 2 * M * N * K / ms / 1e9  # noqa: E731
    ROWS.append((f"{variant}, register-staged", "x".join(map(str, shape)), ours,
                 abs(first - second) / ours, ref, tf(ours), tf(ref), ref / ours, err))


def test_two_consumers_with_private_buffers():
    _hopper()
    from tests.test_ws_oracle import two_consumers
    for D in (64, 128):
        prim, (M, K, N) = two_consumers(D)
        k = tilews.jit(target="hopper")(prim)
        assert k.target == "hopper"
        a = torch.randn(M, K, device="cuda").half()
        b = torch.randn(K, N, device="cuda").half()
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.half)
        k(a, b, c)
        assert rel_err(c, a.double() @ b.double()) < 1e-2


def test_block_sparse_gemm():
    # docs/ws-semantics.md #8 on the GPU: each role skips the K tiles the mask drops and advances its ring
    # phase only on the tiles it ran; a mismatch deadlocks or reads a stale stage
    _hopper()
    from tests.test_ws_oracle import block_sparse_gemm
    M = N = K = 4096
    bm, bn, bk = BIG["block_M"], BIG["block_N"], BIG["block_K"]
    k = tilews.jit(out_idx=[-1], target="hopper")(block_sparse_gemm)(
        M, N, K, bm, bn, bk, stages=3, threads=256, dtype=T.bfloat16)
    assert k.target == "hopper", (k.target, k.report.notes)
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(M // bm, K // bk, generator=g) < 0.5).to(torch.int32)
    mask[::7] = 0                                     # some row blocks keep no K tile at all
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    c1 = k(a, b, mask.cuda())
    c2 = k(a, b, mask.cuda())
    torch.cuda.synchronize()
    keep = mask.repeat_interleave(bm, dim=0).repeat_interleave(bk, dim=1).to(torch.float64).cuda()
    err = rel_err(c1, (a.double() * keep) @ b.double())
    assert err < 1e-2, err
    assert torch.equal(c1, c2), "two runs differ"
    assert not c1.view(M // bm, bm, N)[::7].any(), "row blocks without K tiles must be zero"


@pytest.mark.parametrize("make", [explicit_single, persistent], ids=["two waves", "persistent"])
def test_dependent_launches_back_to_back(make):
    """Programmatic dependent launch (each kernel may start while the previous one still runs; it
    waits for it before touching global memory): a chain of products x[i + 1] = x[i] @ B launched
    back to back without synchronizing, each reading the previous kernel's result, the grid two
    waves deep (256 blocks, one per SM at a time: 164 KB of shared memory each) or persistent
    (one block per SM): each step against float64 of its own input; the kept launches ask for
    programmatic dependent launch."""
    _hopper()
    M = N = K = 2048
    kernel = make(M, N, K)
    b = (torch.randn(K, N, device="cuda") / K ** 0.5).to(torch.bfloat16)
    xs = [torch.randn(M, K, device="cuda").to(torch.bfloat16)]
    for _ in range(8):
        xs.append(kernel(xs[-1], b))
    torch.cuda.synchronize()
    for i in range(1, len(xs)):
        assert rel_err(xs[i], xs[i - 1].double() @ b.double()) < 1e-2, i
    launches = list(kernel.program._host[2].compiled.values())
    assert launches and all(d.pdl for d in launches)


def test_zz_print_table():
    if not ROWS:
        pytest.skip("no timed rows")
    print(f"\n{torch.cuda.get_device_name()}, bf16, medians of triton.testing.do_bench (CUDA events)")
    print("| variant | shape | tilews ms | spread | cuBLAS ms | tilews TFLOP/s | cuBLAS TFLOP/s | ratio | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v, shape, ours, spread, ref, tfo, tfr, ratio, err in ROWS:
        print(f"| {v} | {shape} | {ours:.3f} | {spread:.1%} | {ref:.3f} | {tfo:.0f} | {tfr:.0f} | {ratio:.3f}x | {err:.1e} |")


def test_tile_stored_across_a_unit_middle_dim():
    """A 2-d tile stored into W[m0:m1, s, n0:n1]: a TMA store through a 3-d box with a unit
    middle dim lands in plane s only (the other plane stays poisoned)."""
    _hopper()
    from tests.test_gluon_compile import _store_into_3d
    k = tilews.jit(target="hopper")(_store_into_3d)(128, 128, 128, 2)
    assert k.report.target == "hopper"
    a = torch.randn(128, 128, device="cuda").to(torch.bfloat16)
    b = torch.randn(128, 128, device="cuda").to(torch.bfloat16)
    w = torch.full((128, 2, 128), float("nan"), device="cuda")
    k(a, b, w)
    assert rel_err(w[:, 1], a.double() @ b.double()) < 1e-5
    assert w[:, 0].isnan().all()
