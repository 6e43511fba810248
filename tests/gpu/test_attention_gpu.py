"""Attention and the fused-epilogue GEMM on an sm_90 GPU (H100/H200), through the Hopper (Gluon,
warp-specialized) path: numerics against float32 SDPA (attention) and float64 torch (GEMM), no
NaN (unwritten elements), rel err < 1e-2, bit-identical results over two runs, and the kernel's
target "hopper" (never a silent fallback to triton.language)."""
from __future__ import annotations


import pytest
import torch

import tilews.language as T
from examples.attention import reference as sdpa
from examples.attention import ws_mha_fwd
from tilews.ops import attention, matmul_bias_act
from tilews.lowering.frontend import build_kernel
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.ops.attention import mha_fwd, mha_fwd_program
from tilews.ops.epilogue import matmul_epilogue
from tilews.testing import rel_err

from ..helpers import load
from ..test_fused_epilogue import reference

pytestmark = pytest.mark.gpu
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
TDT = {"fp16": T.float16, "bf16": T.bfloat16}


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")


def blocks_for(D):
    """The blocks tilews.ops.attention picks on a GPU."""
    if D > 128:
        return dict(block_M=128, block_N=64, threads=256, num_stages=1)
    return dict(block_M=128, block_N=128, threads=256, num_stages=2)


def qkv(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)
                 for _ in range(3))


def check_attention(kernel, q, k, v, causal, layout):
    o1 = kernel(q, k, v)
    o2 = kernel(q, k, v)
    torch.cuda.synchronize()
    assert not o1.isnan().any(), "unwritten (NaN) elements"
    err = rel_err(o1, sdpa(q, k, v, causal, layout))
    assert err < 1e-2, err
    assert torch.equal(o1, o2), "two runs differ"
    return o1


# every pair of (head dim, causal, layout, sequence length, dtype) values appears in some case
# (a pairwise cover keeps the number of compiled kernels small); 1000 is not a multiple of the
# 128-row blocks, 4096 is
CASES = [
    (64, False, "bhsd", 4096, "fp16"),
    (64, True, "bshd", 1000, "bf16"),
    (64, True, "bhsd", 4096, "bf16"),
    (64, False, "bshd", 1000, "fp16"),
    (128, True, "bhsd", 4096, "fp16"),
    (128, False, "bshd", 4096, "bf16"),
    (128, False, "bhsd", 1000, "bf16"),
    (128, True, "bshd", 1000, "fp16"),
    (256, True, "bhsd", 4096, "fp16"),    # 64-row K/V blocks in one stage (shared memory)
    (256, False, "bshd", 1000, "bf16"),
]


def batch_heads(S):
    return (2, 8) if S == 4096 else (3, 5)


@pytest.mark.parametrize("D, causal, layout, S, dt", CASES,
                         ids=[f"D{c[0]}-{'causal' if c[1] else 'full'}-{c[2]}-S{c[3]}-{c[4]}" for c in CASES])
def test_attention(D, causal, layout, S, dt):
    _hopper()
    B, H = batch_heads(S)
    shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
    kernel = mha_fwd(B, H, S, D, causal, layout=layout, dtype=TDT[dt], **blocks_for(D))
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    q, k, v = qkv(shape, DT[dt], seed=S + D)
    out = check_attention(kernel, q, k, v, causal, layout)
    # the op picks the same kernel
    assert torch.equal(attention(q, k, v, is_causal=causal, layout=layout), out)


# the automatic kernels of the same configurations are compiled by test_attention already
@pytest.mark.parametrize("D, causal, S, dt", [(64, False, 4096, "fp16"), (128, True, 4096, "fp16"),
                                               (128, False, 1000, "bf16")])
def test_explicit_ws_attention(D, causal, S, dt):
    _hopper()
    B, H = batch_heads(S)
    kernel = ws_mha_fwd(B, H, S, D, causal, block_M=128, block_N=128, stages=2, dtype=TDT[dt])
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    q, k, v = qkv((B, H, S, D), DT[dt], seed=3 * S + D)
    out = check_attention(kernel, q, k, v, causal, "bhsd")
    # the explicit schedule computes the same softmax as the automatic one (not bit for bit:
    # the automatic one may order its blocks differently)
    auto = mha_fwd(B, H, S, D, causal, dtype=TDT[dt], **blocks_for(D))(q, k, v)
    assert rel_err(out, auto.float()) < 1e-2


def test_attention_split_n_consumer():
    # block_M = 64 with two consumer warp groups: the accumulators are split along N between
    # the groups (warps (4, 2)) and P, the register A operand of P V, is needed whole by both
    _hopper()
    B, H, S, D, causal = 2, 4, 1000, 64, True
    kernel = mha_fwd(B, H, S, D, causal, block_M=64, block_N=64, threads=256, num_stages=2)
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    check_attention(kernel, *qkv((B, H, S, D), torch.float16, seed=9), causal, "bhsd")


@pytest.mark.parametrize("causal, layout, S", [(False, "bhsd", 4096), (True, "bshd", 1000)])
def test_attention_three_consumer_warp_groups(causal, layout, S):
    # block_M = 192 over three consumer warp groups (threads=384): one role per warp group with
    # its own 64-row Q and O tiles (a 192-row tile is no power of two for Triton)
    _hopper()
    B, H, D = 2, 8, 64
    shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
    kernel = mha_fwd(B, H, S, D, causal, layout=layout, block_M=192, block_N=128, threads=384,
                     num_stages=2)
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    check_attention(kernel, *qkv(shape, torch.float16, seed=S + 7), causal, layout)


@pytest.mark.parametrize("causal, layout, D", [(True, "bshd", 64), (False, "bhsd", 128)])
def test_persistent_attention_ragged(causal, layout, D):
    # 8 query blocks x 16 heads x 4 = 512 tiles over the SMs (persist), the last block ragged
    _hopper()
    B, H, S = 4, 16, 1000
    shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
    kernel = mha_fwd(B, H, S, D, causal, layout=layout, **blocks_for(D))
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    assert any(n.startswith("persist: 512 tiles") for n in kernel.report.notes), kernel.report.notes
    check_attention(kernel, *qkv(shape, torch.float16, seed=D + causal), causal, layout)


@pytest.mark.parametrize("block_M, threads, causal, S", [(128, 256, True, 1000), (192, 384, False, 4096)])
def test_attention_consumers_taking_turns(block_M, threads, causal, S):
    # the opt-in pingpong schedule: the split consumer warp groups issue their gemms in turn
    _hopper()
    B, H, D = 2, 8, 64
    prim = mha_fwd_program(B, H, S, D, causal, block_M=block_M, block_N=128, threads=threads, num_stages=2)
    prog = load(build_kernel(prim), "gluon", HOPPER.replace(pingpong=True))
    assert any(n.startswith("pingpong:") for n in prog.kernel.notes), prog.kernel.notes

    def run(q, k, v):
        out = torch.full_like(q, float("nan"))
        prog.launch([q, k, v, out])
        return out
    check_attention(run, *qkv((B, H, S, D), torch.float16, seed=S + block_M), causal, "bhsd")


GPU_BLOCKS = dict(block_M=128, block_N=256, block_K=64, threads=256)    # matmul_bias_act's


MATMUL_CASES = [(shape, act) for shape in ((4096, 4096, 512), (8192, 8192, 1024))
                for act in ("relu", "gelu", "silu")] + [((1024, 1024, 512), "none")]   # 32 tiles


@pytest.mark.parametrize("shape, act", MATMUL_CASES, ids=[f"{'x'.join(map(str, s))}-{a}" for s, a in MATMUL_CASES])
def test_matmul_bias_act(shape, act):
    _hopper()
    M, N, K = shape
    alpha = -0.5 if act == "relu" else 1.0
    kernel = matmul_epilogue(M, N, K, act, alpha, dtype=T.bfloat16, **GPU_BLOCKS)
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    tiles = (M // 128) * (N // 256)
    persistent = any(n.startswith("persist:") for n in kernel.report.notes)
    assert persistent == (tiles > torch.cuda.get_device_properties(0).multi_processor_count)
    g = torch.Generator(device="cuda").manual_seed(M + K)
    a = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, generator=g, device="cuda").to(torch.bfloat16)
    bias = torch.randn(N, generator=g, device="cuda").to(torch.bfloat16)
    c1 = matmul_bias_act(a, b, bias, act, alpha=alpha)
    c2 = kernel(a, b, bias)
    torch.cuda.synchronize()
    assert not c1.isnan().any()
    err = rel_err(c1, reference(a, b, bias, act, alpha))
    assert err < 1e-2, err
    assert torch.equal(c1, c2), "two runs differ"


def test_block_sparse_attention_with_k_and_v_rings():
    # the loop body guarded by a block mask (docs/ws-semantics.md #8) with K and V on rings of
    # their own and each consumer role counting the blocks it ran: no deadlock, right numbers
    _hopper()
    import tilews
    from ..passes.test_ring_groups import B, H, S, D, inputs, reference as sparse_reference, sparse_attention
    kernel = tilews.jit(out_idx=[-1], target="hopper")(sparse_attention)()
    assert kernel.target == "hopper", (kernel.target, kernel.report.notes)
    for seed in range(3):
        q, k, v, mask, _ = (t.cuda() for t in inputs(seed))
        out = kernel(q, k, v, mask)
        assert out.shape == (B, H, S, D) and not out.isnan().any()
        assert rel_err(out, sparse_reference(q, k, v, mask).float()) < 1e-2
        assert torch.equal(out, kernel(q, k, v, mask))
