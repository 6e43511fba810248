"""``tilews.ops.attention``'s backward (``tilews/ops/attention_backward.py``) through autograd on
the CPU targets: dq, dk and dv against float64 SDPA's gradients (relative Frobenius error below
2e-3 for fp16 operands), MHA and GQA, causal or not, BHSD and BSHD, a ragged sequence length;
the op records a backward only where an operand requires grad, and its gradients do not depend
on what the outputs held before (poisoned buffers are the op's own: every call allocates). The
main kernel with ``defer_dq`` (each query block's dQ added during the next) gives the same
gradients, and refuses varlen. Compile-only (Hopper): the causal main kernel's loop divides by
no run-time value; the deferred dQ's copy keeps the wgmmas in flight (no C7517). With
``split_partials`` (the default) the Hopper-lowered main kernel (one role per consumer warp group,
each with its own dQ partial) gives the float64 gradients on the interpreter; off, or at D128,
one role. At D96 and D192 the Hopper-lowered main kernel adds dQ's tile as one bulk reduce-add
per piece of the head dim and gives the float64 gradients on the interpreter."""
from __future__ import annotations

import pytest
import torch

from tilews.lowering import ir
from tilews.lowering.traverse import walk
from tilews.ops import attention

from .helpers import randn


def _reference(q, k, v, do, causal, layout):
    bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
    qq, kk, vv = (bhsd(t.detach()).double().requires_grad_() for t in (q, k, v))
    rep = qq.shape[1] // kk.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        qq, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1), is_causal=causal)
    grads = torch.autograd.grad(out, (qq, kk, vv), bhsd(do).double())
    return [bhsd(g) for g in grads]


def _rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2)])
def test_gradients_match_float64(layout, causal, heads, kv_heads):
    B, S, D = 1, 77, 64
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    q = randn(*shape(heads), dtype=torch.float16, seed=1).requires_grad_()
    k = randn(*shape(kv_heads), dtype=torch.float16, seed=2).requires_grad_()
    v = randn(*shape(kv_heads), dtype=torch.float16, seed=3).requires_grad_()
    do = randn(*shape(heads), dtype=torch.float16, seed=4)
    out = attention(q, k, v, is_causal=causal, layout=layout)
    assert out.grad_fn is not None
    out.backward(do)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), _reference(q, k, v, do, causal, layout)):
        assert got.shape == want.shape and got.dtype == torch.float16
        assert _rel(got, want) < 2e-3, name


def test_triton_target_gives_the_same_gradients():
    """The three backward kernels compiled for ``triton`` (Triton's CPU interpreter)."""
    from tilews.ops.attention_backward import attention_backward
    B, H, S, D = 1, 2, 40, 32
    q, k, v, do = (randn(B, H, S, D, dtype=torch.float16, seed=s) for s in range(4))
    o, lse = torch.ops.tilews.attention(q, k, v, True, "bhsd")
    got = [attention_backward(do, q, k, v, o, lse, True, "bhsd", target=t) for t in ("interpret", "triton")]
    want = _reference(q, k, v, do, True, "bhsd")
    for a, b, w in zip(*got, want):
        assert _rel(a, w) < 2e-3 and _rel(b, w) < 2e-3


def test_no_grad_inputs_record_no_backward():
    q, k, v = (randn(1, 2, 16, 32, dtype=torch.float16, seed=s) for s in range(3))
    assert attention(q, k, v).grad_fn is None
    q.requires_grad_()
    with torch.no_grad():
        assert attention(q, k, v).grad_fn is None


def test_torch_compile_forward_and_backward():
    """``torch.compile(fullgraph=True)`` traces the op (``tilews::attention`` and its backward
    ``tilews::attention_backward``, fake implementations included) and gives eager's gradients."""
    def f(q, k, v):
        return (attention(q, k, v, is_causal=True) * 0.5).float().square().sum()
    compiled = torch.compile(f, fullgraph=True)
    q, k, v = (randn(1, 2, 40, 32, dtype=torch.float16, seed=s) for s in range(3))
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).backward()
    f(*eager).backward()
    for a, b in zip(leaves, eager):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("causal", [False, True])
def test_causal_query_blocks_need_no_runtime_remainder(causal):
    """Compile-only (Hopper, Gluon source): a causal K/V block starts at the diagonal's query
    block, already its own, so its loop takes no remainder or quotient by the run-time count of
    query blocks (per query block, ~38 of its 445 sm_90a instructions at D64); non-causal, the
    rotation by ``bx`` stays, a remainder by a constant."""
    import re

    import tilews.language as T
    from tilews.lowering.frontend import build_kernel
    from tilews.lowering.pipeline import lower
    from tilews.ops.attention_backward import blocks, bwd_program
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.gluon.backend import HOPPER

    program = bwd_program(1, 2, 2, 512, 64, causal, 512, dtype=T.float16, **blocks(64, True))
    source = emit(lower(build_kernel(program), HOPPER.replace(num_sms=132)))
    loop = re.search(r"\n( +)for it in range\(.*?\n(.*?)\n\1\S", source, re.S).group(2)
    assert not re.findall(r"(?://|%) *\(*[A-Za-z_]", loop)
    assert bool(re.search(r"\(it \+ \w+\) (?://|%) 8\b", loop)) != causal


def _main_kernel_grads(target, D, causal, group=1, **change):
    """dq, dk, dv of the main kernel compiled for ``target`` with ``change`` (the preprocess and
    postprocess as the op runs them), and the float64 reference."""
    import tilews.language as T
    from tilews.ops.attention_backward import blocks, kernels
    B, H, S = 1, 2 * group, 160
    q, do = (randn(B, H, S, D, dtype=torch.float16, seed=s) for s in (1, 4))
    k, v = (randn(B, H // group, S, D, dtype=torch.float16, seed=s) for s in (2, 3))
    o, lse = torch.ops.tilews.attention(q, k, v, causal, "bhsd")
    rows = lse.shape[-1]
    pre, main, post = kernels(target)
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    pre(B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    main(B, H, H // group, S, D, causal, rows, dtype=T.float16,
         **dict(blocks(D, False), **change))(q, k, v, do, lse, delta, dq_acc, dk, dv)
    post(B, H, S, D, rows, dtype=T.float16)(dq_acc, dq)
    return (dq, dk, dv), _reference(q, k, v, do, causal, "bhsd")


@pytest.mark.parametrize("target, dq_tile_add", [("interpret", True), ("interpret", False),
                                                 ("triton", False)])
@pytest.mark.parametrize("causal, group", [(False, 1), (True, 2)])
def test_deferred_dq_gives_the_float64_gradients(target, dq_tile_add, causal, group):
    """``defer_dq``: each query block's dQ is added during the next one (its first gemms), the
    last after the loop; GQA's head changes between the two."""
    got, want = _main_kernel_grads(target, 64, causal, group, defer_dq=True, dq_tile_add=dq_tile_add)
    for name, a, w in zip("qkv", got, want):
        assert _rel(a, w) < 2e-3, name


def test_deferred_dq_keeps_wgmmas_in_flight_on_hopper():
    """Compile-only (sm_90a): the kept dQ is a register copy (an inline ``mov``) that ptxas does
    not fold into the dQ wgmma's accumulator, so reading it under the next block's gemms
    injects no wait for them (ptxas C7517 without the copy); no spills at D64."""
    import tilews.language as T
    from tilews.lowering.frontend import build_kernel
    from tilews.lowering.pipeline import lower
    from tilews.ops.attention_backward import blocks, bwd_program
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.gluon.backend import HOPPER
    from tilews.triton_ext.toolchain import ptxas_report

    from .helpers import gluon_program

    program = bwd_program(1, 2, 2, 4096, 64, False, 4096, dtype=T.float16,
                          **dict(blocks(64, True), defer_dq=True))
    lowered = lower(build_kernel(program), HOPPER.replace(num_sms=132))
    assert 'inline_asm_elementwise("mov.b32' in emit(lowered)
    report = ptxas_report(gluon_program(lowered).asm["ptx"])
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    assert "C7517" not in report and "0 bytes spill stores" in report, report


def test_deferred_dq_refuses_varlen():
    import tilews.language as T
    from tilews.ops.attention_backward import backward_block
    with pytest.raises(ValueError, match="defer_dq"):
        backward_block(64, 1, False, 64, 32, 2, "varlen", T.float16, defer_dq=True)


def _lowered_main(D, causal, group, split_partials, S=256, sum_partials=False, **change):
    """The main kernel at the op's GPU blocks, lowered for Hopper (``split_partials`` and
    ``sum_partials`` on or off), and its arguments (the preprocess run as the op runs it; dQ's
    accumulator zeroed there)."""
    import tilews.language as T
    from tilews.lowering.frontend import build_kernel
    from tilews.lowering.pipeline import lower
    from tilews.ops.attention_backward import blocks, bwd_program, kernels
    from tilews.triton_ext.gluon.backend import HOPPER
    B, H = 1, 2 * group
    q, do = (randn(B, H, S, D, dtype=torch.float16, seed=s) for s in (1, 4))
    k, v = (randn(B, H // group, S, D, dtype=torch.float16, seed=s) for s in (2, 3))
    o, lse = torch.ops.tilews.attention(q, k, v, causal, "bhsd")
    rows = lse.shape[-1]
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    kernels("interpret")[0](B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    program = bwd_program(B, H, H // group, S, D, causal, rows, dtype=T.float16,
                          **dict(blocks(D, True), **change))
    lowered = lower(build_kernel(program), HOPPER.replace(num_sms=2, split_partials=split_partials,
                                                          sum_partials=sum_partials))
    dk, dv = (torch.full_like(t, float("nan")) for t in (k, v))
    return lowered, [q, k, v, do, lse, delta, dq_acc, dk, dv], _reference(q, k, v, do, causal, "bhsd")


@pytest.mark.parametrize("summed", [False, True])
@pytest.mark.parametrize("causal, group", [(False, 1), (True, 2)])
def test_split_partials_give_the_float64_gradients(causal, group, summed):
    """``split_partials`` (Hopper, D64): each consumer warp group is its own role over its 64 of
    the block's 128 keys, with its own dS^T rows and its own dQ partial (64 queries x D over its
    keys), each reduce-added into dQ's accumulator, or (``sum_partials``) the second role's
    handed to the first through a 2-slot shared ring and the sum added once; the lowered program
    on the interpreter (its race checks on) gives the float64 gradients (GQA's query heads in
    turn, causal's diagonal blocks)."""
    from tilews.lowering import interpreter
    from tilews.lowering.plans import ConsumerSplit
    lowered, args, want = _lowered_main(64, causal, group, True, sum_partials=summed)
    assert lowered.find_plan(ConsumerSplit) is not None, lowered.notes
    assert any("each adds its own partial dq" in n for n in lowered.notes), lowered.notes
    assert any("sum_partials: T.ws(2) hand their partials (dq_1)" in n for n in lowered.notes) == summed
    interpreter.run(lowered, args, seed=1)
    S = args[0].shape[2]
    for name, got, w in zip("qkv", (args[6][:, :, :S], args[7], args[8]), want):
        assert _rel(got, w) < 2e-3, name


@pytest.mark.parametrize("D, causal", [(96, False), (192, True)])
def test_pieces_of_dq_added_by_tile_give_the_float64_gradients(D, causal):
    """``dq_tile_add`` at head dims that are no power of two (the GPU's choice, ``blocks``):
    split_extents cuts dQ's float32 tile into pieces (64 + 32, 128 + 64), each copied to its own
    shared tile and reduce-added into its columns of dQ's accumulator, and each piece's write in
    the next query block waits for its own add (the bulk groups complete in order: at most as
    many outstanding as adds issued after it); the lowered program on the interpreter gives the
    float64 gradients."""
    from tilews.lowering import interpreter
    lowered, args, want = _lowered_main(D, causal, 1, True, S=256 if D == 96 else 128, dq_tile_add=True)
    pieces = (64, 32) if D == 96 else (128, 64)
    assert any(n.startswith("split_extents: cut into") and f"dq_s ({pieces[0]} + {pieces[1]})" in n
               for n in lowered.notes), lowered.notes
    adds = [s for s in walk(lowered.body) if isinstance(s, ir.AtomicAdd)]
    assert [(a.value.buffer.scope, a.value.extents[-1], ir.as_int(a.dst.starts[-1])) for a in adds] == \
        [(ir.Scope.SHARED, pieces[0], 0), (ir.Scope.SHARED, pieces[1], pieces[0])]
    loop = next(s for s in walk(lowered.body) if isinstance(s, ir.For) and adds[0] in s.body.stmts)
    body = list(loop.body.stmts)
    for n, add in enumerate(adds):
        write = next(i for i, s in enumerate(body)
                     if isinstance(s, ir.Copy) and s.dst.buffer == add.value.buffer)
        wait = max(i for i, s in enumerate(body[:write]) if isinstance(s, ir.BulkStoreWait))
        assert body[wait].outstanding <= len(adds) - 1 - n
        assert not any(isinstance(s, ir.AtomicAdd) for s in body[wait:write])
    interpreter.run(lowered, args, seed=1)
    S = args[0].shape[2]
    for name, got, w in zip("qkv", (args[6][:, :, :S], args[7], args[8]), want):
        assert _rel(got, w) < 2e-3, name


def test_split_partials_off_keep_one_role_and_refuse_what_would_spill():
    """Off (``TILEWS_SPLIT_PARTIALS=off``) the backward's consumer stays one role; on (the
    default), D128's accumulators with a whole dQ partial per role (256 registers per thread)
    keep it one role, said why."""
    from tilews.lowering.config import SchedulePolicy
    from tilews.lowering.settings import Settings
    assert SchedulePolicy().split_partials and Settings().split_partials     # on by default
    from tilews.lowering.plans import ConsumerSplit
    off, _, _ = _lowered_main(64, False, 1, False, S=128)
    assert off.find_plan(ConsumerSplit) is None
    assert any("the atomic at line" in n for n in off.notes), off.notes
    d128, _, _ = _lowered_main(128, False, 1, True, S=128)
    assert d128.find_plan(ConsumerSplit) is None
    assert any("would take 256 registers per thread" in n for n in d128.notes), d128.notes


@pytest.mark.parametrize("summed", [False, True])
def test_split_partials_compile_without_spills_on_hopper(summed):
    """Compile-only (sm_90a, D64, B8 H16 S4096): the split roles (one of 256 registers, one of
    232) do not spill; summed, the hand-over's arrivals each follow a barrier of the role's
    warps (every warp's stores or loads of the partial's slot before the one arriving thread)."""
    import re

    import tilews.language as T
    from tilews.lowering.frontend import build_kernel
    from tilews.lowering.pipeline import lower
    from tilews.ops.attention_backward import blocks, bwd_program
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.gluon.backend import HOPPER
    from tilews.triton_ext.toolchain import ptxas_report

    from .helpers import gluon_program

    program = bwd_program(8, 16, 16, 4096, 64, False, 4096, dtype=T.float16, **blocks(64, True))
    lowered = lower(build_kernel(program), HOPPER.replace(num_sms=132, split_partials=True,
                                                          sum_partials=summed))
    source = emit(lowered)
    assert "gl.warp_specialize([(main_ws1, args), (main_ws0, main_ws0_args), (main_ws2, " in source
    handed = re.findall(r"\n( *)(.*)\n\1mbarrier\.arrive\(dq_s_1_(?:full|free)\.", source)
    assert [line for _, line in handed] == (["gl.thread_barrier()"] * 2 if summed else [])
    report = ptxas_report(gluon_program(lowered).asm["ptx"])
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    assert "0 bytes spill stores" in report and "C75" not in report, report
