"""The causal attention backward's units in a balanced order (``tilews/ops/attention_backward.py``:
``balanced_order``, ``bwd_program(order_sms=...)``): the main kernel written persistent, each of
``order_sms`` blocks running the units an int32 ``Order`` tensor gives it. ``balanced_order`` is a
permutation that keeps persist's deal for the first rounds and evens out the blocks' work (query
-block iterations) in the last ones; the ordered program gives the float64 gradients for any
order (a shuffled one, on the interpreter and on Triton's CPU interpreter; the op's order,
lowered for Hopper and run on the interpreter); compile-only it stays warp-specialized on the
user's persistent loop without new spills in the loop; non-causal programs refuse it."""
from __future__ import annotations

import re

import pytest
import torch

import tilews.language as T
from tilews.ops.attention_backward import BALANCED_ROUNDS, balanced_order, blocks, bwd_program, kernels

from .test_attention_backward import _reference, _rel
from .test_attention_tail_split import _inputs


def _work(batch, heads, kv_heads, seq_len, block_M, block_N):
    """Each unit's query-block iterations (causal), in launch order."""
    key_blocks, q_blocks = -(-seq_len // block_M), -(-seq_len // block_N)
    group = heads // kv_heads
    return [group * (q_blocks - (u % key_blocks) * block_M // block_N)
            for u in range(key_blocks * kv_heads * batch)]


def _busiest(order, work, sms) -> float:
    """The busiest block's work over the mean when block b runs positions b, b + sms, ..."""
    load = [0] * sms
    for position, unit in enumerate(order):
        load[position % sms] += work[unit]
    return max(load) / (sum(work) / sms)


@pytest.mark.parametrize("sizes, want", [((4, 32, 32, 4096, 128, 64), 1.0079),
                                         ((8, 16, 16, 4096, 128, 64), 1.0079),
                                         ((2, 16, 16, 8192, 128, 64), 1.0274),
                                         ((4, 32, 8, 4096, 128, 64), 1.0313)])
def test_balanced_order_evens_out_the_blocks_work(sizes, want):
    """The busiest block's work over the mean: 1.031 in persist's deal at each of these shapes;
    balanced, 1.008 at 4096 units, less gained at 2048 and none at 1024 (GQA: 7.8 units a
    block, whose counts differ by one)."""
    order = balanced_order(*sizes, 132)
    work = _work(*sizes)
    assert sorted(order) == list(range(len(work)))
    rounds = -(-len(work) // 132)
    serpentine = [u for u in (r * 132 + (b if r % 2 == 0 else 131 - b)
                              for r in range(rounds) for b in range(132)) if u < len(work)]
    assert _busiest(serpentine, work, 132) == pytest.approx(1.03125)
    assert _busiest(order, work, 132) <= want
    # the first rounds as persist deals them (a round's blocks share the heads they read)
    kept = (rounds - BALANCED_ROUNDS) * 132
    assert list(order[:kept]) == serpentine[:kept]


@pytest.mark.parametrize("target, group, sms", [("interpret", 1, 3), ("interpret", 2, 2), ("triton", 2, 3)])
def test_ordered_program_gives_the_float64_gradients(target, group, sms):
    """Causal, 8 units (2 KV heads x 4 key blocks of 64, the last ragged: S = 200) in a shuffled
    order over ``sms`` blocks; dq, dk, dv poisoned."""
    B, H, S, D = 1, 2 * group, 200, 64
    q, k, v, do, o, lse = _inputs(B, H, 2, S, D, causal=True)
    rows = lse.shape[-1]
    pre, main, post = kernels(target)
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    pre(B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    order = torch.randperm(8, generator=torch.Generator().manual_seed(sms)).to(torch.int32)
    main(B, H, 2, S, D, True, rows, dtype=T.float16, order_sms=sms, **blocks(D, False))(
        q, k, v, do, lse, delta, dq_acc, dk, dv, order)
    post(B, H, S, D, rows, dtype=T.float16)(dq_acc, dq)
    for name, got, w in zip("qkv", (dq, dk, dv), _reference(q, k, v, do, True, "bhsd")):
        assert _rel(got, w) < 2e-3, name


def _hopper(D, sms=132, **sizes):
    from tilews.lowering.frontend import build_function
    from tilews.lowering.pipeline import lower
    from tilews.triton_ext.gluon.backend import HOPPER
    B, H, S = sizes.get("B", 4 if D == 128 else 8), sizes.get("H", 32 if D == 128 else 16), sizes.get("S", 4096)
    program = bwd_program(B, H, H, S, D, True, S, dtype=T.float16,
                          **dict(blocks(D, True), order_sms=sms))
    return lower(build_function(program).kernels[0], HOPPER.replace(num_sms=sms))


def test_the_ops_order_lowered_for_hopper_gives_the_float64_gradients():
    """D64 (one role per consumer warp group) at B1 H2 S512 (16 units) on 3 SMs in the op's
    order, the Hopper-lowered kernel on the interpreter (its race checks on)."""
    from tilews.lowering import interpreter
    from tilews.lowering.plans import ConsumerSplit
    B, H, S, D = 1, 2, 512, 64
    lowered = _hopper(D, sms=3, B=B, H=H, S=S)
    assert lowered.find_plan(ConsumerSplit) is not None, lowered.notes
    q, k, v, do, o, lse = _inputs(B, H, H, S, D, causal=True)
    rows = lse.shape[-1]
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    kernels("interpret")[0](B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    dk, dv = (torch.full_like(t, float("nan")) for t in (k, v))
    cfg = blocks(D, True)
    order = torch.tensor(balanced_order(B, H, H, S, cfg["block_M"], cfg["block_N"], 3), dtype=torch.int32)
    interpreter.run(lowered, [q, k, v, do, lse, delta, dq_acc, dk, dv, order], seed=1)
    for name, got, w in zip("qkv", (dq_acc[:, :, :S], dk, dv), _reference(q, k, v, do, True, "bhsd")):
        assert _rel(got, w) < 2e-3, name


@pytest.mark.parametrize("D", [64, 128])
def test_ordered_kernel_stays_warp_specialized_on_hopper(D):
    """Compile-only (sm_90a, the op's causal shapes): the user's persistent loop is the tile loop
    (no persist note), the producer and consumer roles hold it; neither consumer loop spills
    (D128's reloaded 2 values before its dQ reduce-adds went to a reducer warp, reduce_role)."""
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import gluon_program, innermost_loops
    lowered = _hopper(D)
    assert not any(n.startswith("persist:") for n in lowered.notes), lowered.notes
    assert any("over a persistent tile loop" in n for n in lowered.notes), lowered.notes
    source = emit(lowered)
    assert "gl.warp_specialize(" in source and "warpgroup_mma(" in source
    program = gluon_program(lowered)
    report = ptxas_report(program.asm["ptx"])
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    assert int(re.search(r"(\d+) bytes spill stores", report).group(1)) <= 48, report
    loop = max(innermost_loops(sass(program.asm["ptx"])), key=len)
    spilled = [op for op in loop if op.startswith(("STL", "LDL"))]
    assert spilled == [], spilled


def test_a_non_causal_program_refuses_an_order():
    with pytest.raises(ValueError, match="order_sms=4 orders a causal program"):
        bwd_program(1, 2, 2, 200, 64, False, 200, order_sms=4, **blocks(64, False))
