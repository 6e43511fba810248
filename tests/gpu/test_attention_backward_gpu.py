"""``tilews.ops.attention``'s backward on an sm_90 GPU: dq, dk and dv through autograd against
float64 SDPA's gradients (relative Frobenius error below 1e-2; outputs the op allocates, so no
poisoning is needed: a gradient element no kernel wrote would be uninitialized memory, caught as
error or NaN), head dims 64 to 256, causal or not, MHA and GQA, fp16 and bf16; and the main
kernel on the warp-specialized Gluon path (target "hopper", never a silent fallback)."""
from __future__ import annotations

import pytest
import torch

import tilews.language as T
from tilews.ops import attention
from tilews.ops.attention import lse_rows
from tilews.ops.attention_backward import blocks, kernels
from tilews.testing import rel_err

pytestmark = pytest.mark.gpu


def _reference(q, k, v, do, causal):
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    rep = qq.shape[1] // kk.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        qq, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1), is_causal=causal)
    return torch.autograd.grad(out, (qq, kk, vv), do.double())


@pytest.mark.parametrize("dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, heads, kv_heads", [(torch.float16, 4, 4), (torch.bfloat16, 8, 2)])
def test_gradients_against_float64(dim, causal, dtype, heads, kv_heads):
    g = torch.Generator(device="cuda").manual_seed(dim)
    B, S = 2, 1000
    q = torch.randn(B, heads, S, dim, device="cuda", generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(B, kv_heads, S, dim, device="cuda", generator=g).to(dtype).requires_grad_()
            for _ in range(2))
    do = torch.randn(B, heads, S, dim, device="cuda", generator=g).to(dtype)
    attention(q, k, v, is_causal=causal).backward(do)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), _reference(q, k, v, do, causal)):
        assert not got.isnan().any(), name
        assert rel_err(got, want) < 1e-2, (name, rel_err(got, want))


@pytest.mark.parametrize("dim", [64, 96, 128, 192, 256])
def test_main_kernel_is_warp_specialized(dim):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    rows = lse_rows(4096, 128)
    kernel = kernels()[1](2, 16, 4, 4096, dim, True, rows, dtype=T.bfloat16, **blocks(dim, True))
    assert kernel.target == "hopper", kernel.report.notes


@pytest.mark.parametrize("dim", [64, 96, 128, 192])
def test_split_tail_against_the_unsplit_backward(dim):
    """The main kernel with its last wave split (64 units of B2 H4 S1000 in 2 parts each: all of
    them, half at D192's block_M 64) against the unsplit one, same inputs. D96 and D192 add
    their parts' dK and dV in the head dim's pieces (64 + 32, 128 + 64) by element (dQ by one
    bulk reduce-add per piece): D96's 32 columns were once added twice
    (tests/test_attention_tail_split.py ``test_split_tail_adds_each_element_once_at_head_dim_96``)."""
    from tilews.ops.attention_backward import attention_backward
    g = torch.Generator(device="cuda").manual_seed(dim)
    q, k, v, do = (torch.randn(2, 4, 1000, dim, device="cuda", generator=g).half() for _ in range(4))
    out, lse = torch.ops.tilews.attention(q, k, v, False, "bhsd")
    _, bwd, _ = kernels()
    rows, unsplit = lse.shape[-1], attention_backward(do, q, k, v, out, lse, False, "bhsd", split_tail=False)
    delta, dq_acc = torch.empty_like(lse), torch.empty(2, 4, rows, dim, device="cuda")
    kernels()[0](2, 4, 1000, dim, rows, dtype=T.float16)(out, do, delta, dq_acc)
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    cfg = dict(blocks(dim, True), tail_units=64, tail_parts=2)
    workspace = torch.zeros(64, 2, cfg["block_M"], dim, device="cuda")
    bwd(2, 4, 4, 1000, dim, False, rows, dtype=T.float16, **cfg)(q, k, v, do, lse, delta, dq_acc, dk, dv, workspace)
    errors = {name: rel_err(got, want) for name, got, want in (("k", dk, unsplit[1]), ("v", dv, unsplit[2]))}
    assert max(errors.values()) < 1e-3, errors
