"""take_turns (opt-in, ``TILEWS_TAKE_TURNS``): the D128 attention backward's two consumer warp
groups as roles that compute dQ over all 128 keys in turns, one query block each, instead of one
merged role (docs/performance.md, "Attention backward": cuDNN's schedule; slower in the op's
split-tail and causal kernels, which spill).

The lowered kernels run on the interpreter (its race checks on) and give the float64 gradients;
compile-only, the kernel has the handshake and the turns, and ptxas keeps the loop free of
spills in the plain (unsplit, non-causal) kernel."""
from __future__ import annotations

import pytest
import torch

import tilews.language as T
from tilews.ops.attention_backward import balanced_order, blocks, bwd_program, kernels

from .test_attention_backward import _reference, _rel
from .test_attention_tail_split import _inputs


def lowered_backward(B, H, S, D, causal, sms, policy: dict, **extra):
    """The op's main backward program at ``blocks(D, True)`` (``extra``: its tail-split or order
    parameters) lowered for Hopper on ``sms`` SMs with the schedule ``policy`` given."""
    from tilews.lowering.frontend import build_function
    from tilews.lowering.pipeline import lower
    from tilews.triton_ext.gluon.backend import HOPPER
    program = bwd_program(B, H, H, S, D, causal, S, dtype=T.float16, **dict(blocks(D, True), **extra))
    return lower(build_function(program).kernels[0], HOPPER.replace(num_sms=sms, **policy))


def _lowered(B, H, S, D, causal, sms, turns=True, **extra):
    return lowered_backward(B, H, S, D, causal, sms, dict(take_turns=turns), **extra)


FORMS = pytest.mark.parametrize("causal, extra", [(False, {}), (False, dict(tail_units=2, tail_parts=3)),
                                                  (True, dict(order_sms=3))],
                                ids=["plain", "split-tail", "causal-ordered"])
"""The D128 main kernel's three forms in the op: plain, with a split tail, causal in a balanced
order (B1 H2 S384 on 3 SMs)."""


def gives_the_float64_gradients(lowered, B, H, S, D, causal, extra) -> None:
    """The lowered kernel on the interpreter (roles concurrently, races checked) gives float64
    SDPA's gradients (dK / dV of a split tail's parts go to the workspace: dQ checked there)."""
    from tilews.lowering import interpreter
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


@FORMS
def test_turns_give_the_float64_gradients(causal, extra):
    """The lowered kernel takes turns and gives the float64 gradients."""
    from tilews.lowering.plans import ConsumerSplit
    B, H, S, D = 1, 2, 384, 128
    lowered = _lowered(B, H, S, D, causal, 3, **extra)
    split = lowered.find_plan(ConsumerSplit)
    assert split is not None and split.turns, lowered.notes
    assert any(n.startswith("take_turns: T.ws(1) and T.ws(2) compute dq over all 128 rows")
               for n in lowered.notes), lowered.notes
    gives_the_float64_gradients(lowered, B, H, S, D, causal, extra)


def test_off_by_default_and_d64_keeps_its_own_partials():
    """Without the policy D128 keeps one merged consumer; with it, D64 (whose partials fit)
    still adds each role's own partial."""
    from tilews.lowering.plans import ConsumerSplit
    off = _lowered(1, 2, 384, 128, False, 3, turns=False)
    assert off.find_plan(ConsumerSplit) is None, off.notes
    d64 = _lowered(1, 2, 384, 64, False, 3)
    assert d64.find_plan(ConsumerSplit) is not None and not d64.find_plan(ConsumerSplit).turns


def test_turns_kernel_on_sm90a():
    """Compile-only, the op's D128 shape (B4 H32 S4096, persistent on 132 SMs): dS in two slots
    handed over by a barrier of two arrivals, each role's dQ gemm over K's 128 rows in a branch
    on the slot, the epilogue stored from registers, 240 registers a role, and no spill in the
    roles' loops."""
    import re

    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import gluon_program, innermost_loops
    lowered = _lowered(4, 32, 4096, 128, False, 132)
    source = emit(lowered)
    assert "dsT_s = gl.allocate_shared_memory(gl.float16, [2, 128, 64]" in source
    assert source.count("mbarrier.init(dsT_s_ready.index(") == 2 and "count=2)" in source
    assert len(re.findall(r"if t_\d+ == [01]:", source)) == 2
    assert source.count("permute((1, 0)), K_s, dq_") == 2
    assert "[24, 240])" in source and "dv_stage" not in source
    ptx = gluon_program(lowered).asm["ptx"]
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    assert "C7512" not in report, report
    loops = [lp for lp in innermost_loops(sass(ptx)) if len(lp) > 200]
    assert len(loops) == 2, [len(lp) for lp in loops]
    for loop in loops:
        assert not [op for op in loop if op.startswith(("STL", "LDL"))], loop
        assert sum(op.startswith("HGMMA") for op in loop) == 32
