"""reduce_role: the D128 attention backward's dQ reduce-adds go out from a reducer warp of their
own; the merged consumer stores dQ's tile, fences and hands it over with its ring release, and
waits for the reducer's hand-back before the next store.

The lowered kernels run on the interpreter (roles concurrently, races checked) and give the
float64 gradients; compile-only, the consumer's loop issues no reduce-add and the reducer's
does, and the loop keeps its barriers and its freedom from spills."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.traverse import walk
from tilews.ops.attention_backward import balanced_order, blocks, bwd_program, kernels

from .test_attention_backward import _reference, _rel
from .test_attention_tail_split import _inputs


def _lowered(B, H, S, D, causal, sms, reduce_role=True, **extra):
    from tilews.lowering.frontend import build_function
    from tilews.lowering.pipeline import lower
    from tilews.triton_ext.gluon.backend import HOPPER
    program = bwd_program(B, H, H, S, D, causal, S, dtype=T.float16, **dict(blocks(D, True), **extra))
    config = HOPPER.replace(num_sms=sms)
    config = dataclasses.replace(config, policy=dataclasses.replace(config.policy, reduce_role=reduce_role))
    return lower(build_function(program).kernels[0], config)


def _roles(kernel):
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    return {r.warpgroups: r for r in ws.roles}


@pytest.mark.parametrize("causal, extra", [(False, {}), (False, dict(tail_units=2, tail_parts=3)),
                                           (True, dict(order_sms=3))],
                         ids=["plain", "split-tail", "causal-ordered"])
def test_reducer_gives_the_float64_gradients(causal, extra):
    """B1 H2 S384 D128 on 3 SMs: the lowered kernel has the reducer warp, and the interpreter
    (roles concurrently, races checked) gives float64 SDPA's gradients (a split tail's dK / dV
    parts go to the workspace: dQ checked there)."""
    from tilews.lowering import interpreter
    B, H, S, D = 1, 2, 384, 128
    lowered = _lowered(B, H, S, D, causal, 3, **extra)
    assert any(n.startswith("reduce_role: the bulk reduce-adds of dq_s") for n in lowered.notes), lowered.notes
    reducer = _roles(lowered)[(3,)]
    assert reducer.num_warps == 1 and lowered.threads == 512
    releases = [s for s in walk(_roles(lowered)[(1, 2)].body) if isinstance(s, ir.BarrierArrive)
                and s.barrier.buffer.name == "empty_dO_s"]
    assert len(releases) == 1 and releases[0].after_role_barrier     # it hands dQ's tile over
    q, k, v, do, o, lse = _inputs(B, H, H, S, D, causal=causal)
    rows = lse.shape[-1]
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    kernels("interpret")[0](B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    dk, dv = (torch.full_like(t, float("nan")) for t in (k, v))
    args = [q, k, v, do, lse, delta, dq_acc, dk, dv]
    if "tail_units" in extra:
        args.append(torch.zeros(extra["tail_units"], 2, 128, D))
    if "order_sms" in extra:
        cfg = blocks(D, True)
        args.append(torch.tensor(balanced_order(B, H, H, S, cfg["block_M"], cfg["block_N"], 3),
                                 dtype=torch.int32))
    interpreter.run(lowered, args, seed=1)
    want = _reference(q, k, v, do, causal, "bhsd")
    assert _rel(dq_acc[:, :, :S], want[0]) < 2e-3
    if "tail_units" not in extra:
        assert _rel(dk, want[1]) < 2e-3 and _rel(dv, want[2]) < 2e-3


def test_off_and_where_it_does_not_apply():
    """With the policy off the merged consumer adds dQ itself; D64's split roles (one dQ partial
    each, two consumer roles) keep their own adds."""
    off = _lowered(1, 2, 384, 128, False, 3, reduce_role=False)
    assert set(_roles(off)) == {(0,), (1, 2)} and off.threads == 384
    d64 = _lowered(1, 2, 384, 64, False, 3)
    assert (3,) not in _roles(d64) and not any(n.startswith("reduce_role") for n in d64.notes)


def test_reducer_kernel_on_sm90a():
    """Compile-only, the op's D128 shape (B4 H32 S4096, persistent on 132 SMs): the reducer is a
    one-warp partition issuing the reduce-adds; the consumer waits for the hand-back and issues
    none; its loop keeps 3 block barriers (the one before the release also covers dQ's store)
    and no spills."""
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import gluon_program, innermost_loops
    lowered = _lowered(4, 32, 4096, 128, False, 132)
    source = emit(lowered)
    functions = {m.group(1): m.group(0) for m in re.finditer(r"def (main_ws[\d_]+)\(.*?(?=\n\n\n)", source, re.S)}
    assert "async_reduce_add" not in functions["main_ws1_2"]
    assert "mbarrier.wait(dq_s_drained.index(0)" in functions["main_ws1_2"]
    assert "async_reduce_add" in functions["main_ws3"] and "mbarrier.arrive(dq_s_drained" in functions["main_ws3"]
    assert "(main_ws3, " in source and "[1, 1], [24, 24])" in source
    ptx = gluon_program(lowered).asm["ptx"]
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    loop = max(innermost_loops(sass(ptx)), key=len)
    assert not [op for op in loop if op.startswith(("STL", "LDL", "UTMAREDG"))], loop
    assert sum(op.startswith("BAR.SYNC") for op in loop) == 3
    assert sum(op.startswith("HGMMA") for op in loop) == 32
