"""The triton.language backend on a real GPU: numerics against float64 torch, no NaN, bit-identical
across two runs, and timings against torch.matmul printed as a table (run with -s)."""
from __future__ import annotations

import pytest
import torch

import tilews
from examples.gemm import matmul as matmul_any_target
from examples.softmax import softmax as softmax_any_target
from examples.ws_gemm import ws_matmul
from tilews.testing import rel_err, time_ms

pytestmark = pytest.mark.gpu
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
matmul = tilews.jit(out_idx=[-1], target="triton")(matmul_any_target.fn)
softmax = tilews.jit(out_idx=[-1], target="triton")(softmax_any_target.fn)
ROWS = []


def _gemm_check(M, N, K, dt, blocks):
    import tilews.language as T
    tdt = {"fp16": T.float16, "bf16": T.bfloat16}[dt]
    k = matmul(M, N, K, dtype=tdt, **blocks)
    assert k.target == "triton"
    a = torch.randn(M, K, device="cuda").to(DT[dt])
    b = torch.randn(K, N, device="cuda").to(DT[dt])
    c1 = k(a, b)
    c2 = k(a, b)
    err = rel_err(c1, a.double() @ b.double())
    assert err < 1e-2, err
    assert torch.equal(c1, c2), "two runs differ"
    return k, a, b


@pytest.mark.parametrize("dt", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (8192, 8192, 8192), (1000, 1100, 1234), (513, 257, 129)])
def test_gemm(shape, dt):
    M, N, K = shape
    blocks = dict(block_M=128, block_N=128, block_K=64, num_stages=3)
    k, a, b = _gemm_check(M, N, K, dt, blocks)
    if M >= 4096:
        ours = time_ms(lambda: k(a, b), a.device)
        ref = time_ms(lambda: a @ b, a.device)
        tf = lambda ms: 2 * M * N * K / ms / 1e9  # noqa: E731
        ROWS.append((f"{M}x{N}x{K} {dt}", ours, ref, tf(ours), tf(ref), ref / ours))


def test_softmax():
    M, N = 4096, 1024
    k = softmax(M, N, block_M=16)
    x = torch.randn(M, N, device="cuda") * 3
    y = k(x)
    assert rel_err(y, torch.softmax(x.double(), 1)) < 1e-5


def test_ws_gemm_despecialized():
    M, N, K = 1000, 1100, 1234
    k = ws_matmul(M, N, K, target="triton", block_M=128, block_N=128, block_K=64)
    a = torch.randn(M, K, device="cuda").half()
    b = torch.randn(K, N, device="cuda").half()
    assert rel_err(k(a, b), a.double() @ b.double()) < 1e-2
    assert any("de-specialized" in n or "one stream" in n for n in k.report.notes), k.report.notes


def test_zz_print_table():
    if not ROWS:
        pytest.skip("no timed rows")
    print("\n| shape | tilews tl ms | torch.matmul ms | tilews TFLOP/s | cuBLAS TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|")
    for name, ours, ref, tfo, tfr, ratio in ROWS:
        print(f"| {name} | {ours:.3f} | {ref:.3f} | {tfo:.0f} | {tfr:.0f} | {ratio:.2f}x |")
